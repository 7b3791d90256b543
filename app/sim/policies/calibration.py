"""The calibration an operator runs once before writing a static placement table.

For one node of each hardware class, on its own and otherwise idle (a one-node cluster of the simulator,
no events), it submits:

- *idle* tasks, one at a time, for each app the node can run, twice at each of seven input sizes spread
  over the app's range (the 5th to 95th percentile), and fits ``rtt = a + b * input_mb`` by least squares;
- *batches* of ``c`` = 2, 3, 4 identical tasks at once (median input; only as many as the node's
  requests allow together), whose RTTs over the idle fit give the slowdown of ``c - 1`` neighbours.

Everything is read from the completions (RTT per task, as task-completions carry it), not from the
simulator's internals. :func:`fit` turns the samples of every class into a table ``(a, b)`` per
(hardware class, app) and one contention factor ``k``, the least-squares slope of
``rtt / idle_fit - 1`` on the number of other running tasks, ``c - 1``.

>>> from app.sim.hardware import small_preset
>>> samples = measure(small_preset()[2])
>>> table, k = fit({hardware_class(small_preset()[2]): samples})
>>> sorted(app for _, app in table), 0.3 < k < 1.0
(['Motioncor2', 'gCTF', 'upload'], True)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

import numpy as np
import simpy
from scipy.stats import norm

from app.sim.apps import APPS
from app.sim.cluster import Cluster
from app.sim.hardware import NodeSpec
from app.sim.policies.base import BasePolicy
from app.sim.state import NodeRuntime
from app.sim.view import ClusterView, Task
from app.sim.workload import INPUT_MB, Workload

SIZES_Q = (0.05, 0.2, 0.35, 0.5, 0.65, 0.8, 0.95)  # input-size percentiles of the idle runs
BATCHES = (2, 3, 4)  # tasks started together in the contention runs
REPEATS = 2  # idle runs per input size
GAP_S = 10.0  # between calibration groups: every task of a group is long done
SEED = 0  # the calibration's own noise draws (it is measured once, whatever run follows)


@dataclasses.dataclass(frozen=True)
class Sample:
    app: str
    input_mb: float
    rtt_ms: float
    together: int  # tasks started at once (1 = idle)


def hardware_class(node: NodeSpec) -> NodeSpec:
    """A node's hardware class: its spec without name or join time (nodes alike share one table row)."""
    return dataclasses.replace(node, name="calibration", join_at_s=0.0)


class _Recorder(BasePolicy):
    name = "calibration"

    def __init__(self) -> None:
        super().__init__()
        self.rtt_ms: dict[int, float] = {}

    def choose(self, task: Task, candidates: Sequence[NodeSpec], view: ClusterView) -> NodeSpec:
        return candidates[0]

    def observe_completion(self, task: Task, node: str, rtt_ms: float, view: ClusterView) -> None:
        self.rtt_ms[task.idx] = rtt_ms


def _sizes(app: str) -> list[float]:
    med, sigma, lo, hi = INPUT_MB[app]
    return [float(np.clip(med * np.exp(sigma * norm.ppf(q)), lo, hi)) for q in SIZES_Q]


def _concurrency(node: NodeSpec, app: str, mb: float, upto: int) -> int:
    rt = NodeRuntime(node, 0)
    n = 0
    while n < upto and rt.has_room(APPS[app], mb):
        rt.start(n, APPS[app], mb, 1.0, 0.0)
        n += 1
    return n


def measure(node: NodeSpec) -> tuple[Sample, ...]:
    """The calibration samples of ``node``'s hardware class (measured once per class)."""
    return _measure(hardware_class(node))


@functools.lru_cache(maxsize=256)
def _measure(node: NodeSpec) -> tuple[Sample, ...]:
    plan: list[tuple[float, str, float, int]] = []  # (arrival, app, MB, together)
    t = 0.0
    for app in sorted(APPS):
        for mb in _sizes(app) * REPEATS:
            if APPS[app].fits(node, mb):
                plan.append((t, app, mb, 1))
                t += GAP_S
        mb = _sizes(app)[len(SIZES_Q) // 2]
        if not APPS[app].fits(node, mb):
            continue
        for c in BATCHES:
            n = _concurrency(node, app, mb, c)
            if n < 2:
                break
            plan.extend((t, app, mb, n) for _ in range(n))
            t += GAP_S
    if not plan:
        return ()
    rng = np.random.default_rng(SEED)
    workload = Workload(np.array([p[0] for p in plan]), tuple(p[1] for p in plan), np.array([p[2] for p in plan]),
                        rng.standard_normal(len(plan)))
    env = simpy.Environment()
    recorder = _Recorder()
    Cluster(env, [node], workload, recorder, rng, events=(), scrape_interval_s=GAP_S)
    env.run()
    return tuple(Sample(app, mb, recorder.rtt_ms[i], c) for i, (_, app, mb, c) in enumerate(plan)
                 if i in recorder.rtt_ms)


def fit(samples: Mapping[NodeSpec, Sequence[Sample]]) -> tuple[dict[tuple[NodeSpec, str], tuple[float, float]], float]:
    """(``(class, app) -> (a_ms, b_ms_per_mb)``, contention factor ``k``) from every class's samples."""
    table: dict[tuple[NodeSpec, str], tuple[float, float]] = {}
    num = den = 0.0
    for cls, rows in samples.items():
        for app in sorted({s.app for s in rows}):
            idle = [s for s in rows if s.app == app and s.together == 1]
            if not idle:
                continue
            x = np.array([s.input_mb for s in idle])
            y = np.array([s.rtt_ms for s in idle])
            b, a = np.polyfit(x, y, 1) if len(set(x.tolist())) > 1 else (0.0, float(y.mean()))
            table[(cls, app)] = (float(a), float(b))
            for s in rows:
                if s.app == app and s.together > 1:
                    base = a + b * s.input_mb
                    num += (s.rtt_ms / base - 1.0) * (s.together - 1)
                    den += (s.together - 1) ** 2
    return table, (float(num / den) if den > 0 else 0.0)
