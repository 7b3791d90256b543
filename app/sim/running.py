"""One running task's progress, and the rate the node serves it at (processor sharing per resource).

``factor_of`` is the model of :mod:`app.sim.apps`: ``(1 + sum_r w[r] * load[r] + pairs) * throttle *
slowdown``, where ``load[r]`` is what the *other* tasks (and background) put on ``r``: the task's own demand
is taken out of the node's totals. GPU compute and memory bandwidth count on the task's GPU only.

>>> from app.sim.apps import APPS
>>> p = APPS["gCTF"].place
>>> r = Running(0, "gCTF", p, 0, 1.3, work_ms=100.0, now=0.0)
>>> factor_of(r, list(p.d), p.d[:2], (0.0,) * 5, 16, {"gCTF": 1}, slowdown=1.0, throttle=1.0)  # alone
1.0
>>> r.factor = 2.0; r.advance(0.1); r.left_ms, r.served_ms
(50.0, 50.0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from app.sim.apps import Placement, interference


class Running:
    """A task bound to a node: its work (ms at rate 1), what is left, its current slowdown and finish time."""

    __slots__ = ("idx", "app", "place", "gpu", "gpu_mem_gb", "work_ms", "left_ms", "served_ms", "factor", "t",
                 "finish_s", "start_s", "start_factor")

    def __init__(self, idx: int, app: str, place: Placement, gpu: int, gpu_mem_gb: float, work_ms: float,
                 now: float) -> None:
        self.idx = idx
        self.app = app
        self.place = place
        self.gpu = gpu  # index of its GPU on the node, -1 without one
        self.gpu_mem_gb = gpu_mem_gb
        self.work_ms = work_ms
        self.left_ms = work_ms
        self.served_ms = 0.0
        self.factor = 1.0
        self.t = now
        self.start_s = now
        self.start_factor = 0.0  # factor when it started (0 until the first rating)
        self.finish_s = now + work_ms / 1000.0

    def advance(self, now: float) -> None:
        """Serve the work done since the last update at the current rate."""
        dt = now - self.t
        if dt > 0:
            done = min(self.left_ms, dt * 1000.0 / self.factor)
            self.left_ms -= done
            self.served_ms += done
            self.t = now

    def left_now(self, now: float) -> float:
        """Remaining work at ``now`` at the current rate (without updating)."""
        return max(0.0, self.left_ms - max(0.0, now - self.t) * 1000.0 / self.factor)


def factor_of(run: Running, node_demand: Sequence[float], gpu_demand: Sequence[float],
              background: Sequence[float], cpu_cores: float, gpu_apps: Mapping[str, int], slowdown: float,
              throttle: float) -> float:
    """Slowdown of ``run`` given the node's summed task demand per resource (``run`` included), its GPU's
    ``(compute, membw)`` demand and the background load per resource (GPU terms per GPU)."""
    w, d = run.place.w, run.place.d
    f = 1.0
    if run.gpu >= 0:
        f += w[0] * (gpu_demand[0] - d[0] + background[0]) + w[1] * (gpu_demand[1] - d[1] + background[1])
        for other, n in gpu_apps.items():
            k = n - 1 if other == run.app else n
            if k > 0:
                f += k * interference(run.app, other)
    f += w[2] * (node_demand[2] - d[2] + background[2]) + w[3] * (node_demand[3] - d[3] + background[3])
    f += w[4] * (node_demand[4] - d[4] + background[4]) / cpu_cores
    f *= slowdown
    if run.place.throttle_sensitive:
        f *= throttle
    return max(f, 1e-9)
