"""The live state of one simulated node: requests, running tasks and their rates, utilisation integrals.

Requests (CPU cores, host memory, ``nvidia.com/gpu`` shares and GPU memory per GPU) decide whether a task
*fits*, as kube-scheduler's NodeResourcesFit filter does; a GPU task is bound to one GPU of the node (the
one with the most free shares). Demands decide how fast the running tasks progress: every start, end or
condition change re-rates every running task (:meth:`NodeRuntime.rerate`), so a placement slows its
neighbours and a departure speeds them up (processor sharing per resource, see :mod:`app.sim.apps`).
A task's *work* (ms at rate 1) is fixed when it starts; its remaining work shrinks at ``1 / factor``.

>>> from app.sim.hardware import small_preset
>>> from app.sim.apps import APPS
>>> rt = NodeRuntime(small_preset()[2], 2)
>>> a = rt.start(0, APPS["gCTF"], 80.0, work_ms=100.0, now=0.0); a.finish_s
0.1
>>> b = rt.start(1, APPS["gCTF"], 80.0, work_ms=100.0, now=0.05); round(a.finish_s, 4)  # b slows a down
0.125
>>> rt.end(a, a.finish_s); round(b.finish_s, 4), round(a.served_ms, 9)
(0.175, 100.0)
"""

from __future__ import annotations

import math

import numpy as np

from app.sim.apps import NOISE_SIGMA, RESOURCES, AppProfile, interference, ms_per_mb
from app.sim.events import NodeCondition
from app.sim.hardware import NodeSpec
from app.sim.running import Running, factor_of

EPS = 1e-9
GPU, MEMBW, PCIE, DISK, CPU = range(5)  # indices into RESOURCES
_NO_GPU = (0.0, 0.0)


class NodeRuntime:
    def __init__(self, spec: NodeSpec, idx: int) -> None:
        self.spec = spec
        self.idx = idx
        self.name = spec.name
        self.cpu_used = 0.0
        self.mem_used = 0.0
        g = spec.gpu_count
        self._gpu_mem_cap = spec.gpu.mem_gb if spec.gpu else 0.0
        # what is free, kept current for the filter's hot path
        self.free_cpu = float(spec.cpu_cores)
        self.free_mem = float(spec.mem_gb)
        self.gpu_room = self._gpu_mem_cap if g else -1.0  # most GPU memory free on a GPU with a share free
        self.room: np.ndarray | None = None  # (free_cpu, free_mem, gpu_room) kept current there once attached
        self.gpu_shares = [0] * g  # shares in use, per GPU
        self.gpu_mem = [0.0] * g  # GB in use, per GPU
        self.gpu_demand = [[0.0, 0.0] for _ in range(g)]  # (compute, memory bandwidth) per GPU
        self.gpu_apps: list[dict[str, int]] = [{} for _ in range(g)]  # running tasks per app, per GPU
        self.node_demand = [0.0] * 5  # summed task demand per resource (RESOURCES order)
        self.running: dict[int, Running] = {}
        self.cond = NodeCondition()
        self._bg: tuple[float, ...] = (0.0,) * 5  # background load per resource (GPU terms per GPU), at last rerate
        self.joined = spec.join_at_s <= 0
        self.cordoned = False
        self.left_s: float | None = None
        self.last_t = 0.0
        self.version = 0  # bumped on every change of rates (stale completion timers compare it)
        self.placed_since_scrape = 0
        self._per_mb: dict[str, float] = {}
        # time integrals since the node joined
        self.gpu_busy_area = 0.0  # sum over GPUs of time with >= 1 task
        self.busy_area = 0.0  # time with >= 1 task on the node
        self.gpu_demand_area = 0.0  # time integral of min(1, compute demand / GPUs)
        self.area = dict.fromkeys((*RESOURCES, "streams"), 0.0)  # time integrals of task demand
        self._mark = dict(self.area)
        self._mark_t = 0.0

    # -- requests
    @property
    def gpu_shares_used(self) -> int:
        return sum(self.gpu_shares)

    @property
    def gpu_mem_used(self) -> float:
        return sum(self.gpu_mem)

    @property
    def gpu_tasks(self) -> int:
        return sum(sum(a.values()) for a in self.gpu_apps)

    def pick_gpu(self, app: AppProfile, input_mb: float) -> int | None:
        """The GPU a task of ``app`` would be bound to (most free shares, then lowest index), or None."""
        p = app.place
        need = app.gpu_mem_gb(input_mb)
        best, best_free = None, 0
        for i, used in enumerate(self.gpu_shares):
            free = self.spec.gpu_slots - used
            if free >= p.gpu_share and free > best_free and self.gpu_mem[i] + need <= self._gpu_mem_cap + EPS:
                best, best_free = i, free
        return best

    def has_room(self, app: AppProfile, input_mb: float) -> bool:
        """True when the task's requests fit in what is free now (the caller checked :meth:`AppProfile.fits`)."""
        p = app.place
        if self.free_cpu < p.cpu_cores - EPS or self.free_mem < p.mem_gb - EPS:
            return False
        if not p.gpu_share:
            return True
        if p.gpu_share == 1:
            return self.gpu_room >= app.gpu_mem_gb(input_mb) - EPS
        return self.pick_gpu(app, input_mb) is not None

    def free_gpu_mem(self, app: AppProfile) -> float:
        """Most GPU memory free on one GPU with a share free, where ``app``'s CPU and memory fit (else -1)."""
        p = app.place
        if self.free_cpu < p.cpu_cores - EPS or self.free_mem < p.mem_gb - EPS:
            return -1.0
        if p.gpu_share == 1:
            return self.gpu_room
        best = -1.0
        for i, used in enumerate(self.gpu_shares):
            if self.spec.gpu_slots - used >= p.gpu_share:
                best = max(best, self._gpu_mem_cap - self.gpu_mem[i])
        return best

    def attach_room(self, row: np.ndarray) -> None:
        """Keep ``row`` (three float64) equal to (free_cpu, free_mem, gpu_room) from now on: the cluster's filter
        compares every node's at once."""
        self.room = row
        row[:] = (self.free_cpu, self.free_mem, self.gpu_room)

    def _update_room(self) -> None:
        s = self.spec
        self.free_cpu = s.cpu_cores - self.cpu_used
        self.free_mem = s.mem_gb - self.mem_used
        if s.gpu_count:
            free = [self._gpu_mem_cap - m for m, used in zip(self.gpu_mem, self.gpu_shares, strict=True)
                    if used < s.gpu_slots]
            self.gpu_room = max(free) if free else -1.0
        if self.room is not None:
            self.room[:] = (self.free_cpu, self.free_mem, self.gpu_room)

    # -- service
    def ideal_ms(self, app: AppProfile, input_mb: float) -> float:
        per_mb = self._per_mb.get(app.name)
        if per_mb is None:
            per_mb = self._per_mb[app.name] = ms_per_mb(app, self.spec)
        return app.place.overhead_ms + input_mb * per_mb

    def work_ms(self, app: AppProfile, input_mb: float, noise_z: float) -> float:
        """A task's true work here: its ideal time times its log-normal noise (sigma by node class, mean 1)."""
        sigma = NOISE_SIGMA[self.spec.node_class]
        return self.ideal_ms(app, input_mb) * math.exp(sigma * noise_z - 0.5 * sigma * sigma)

    def _factor(self, run: Running) -> float:
        g = run.gpu
        return factor_of(run, self.node_demand, self.gpu_demand[g] if g >= 0 else _NO_GPU, self._bg,
                         self.spec.cpu_cores, self.gpu_apps[g] if g >= 0 else {}, self.cond.slowdown,
                         self.cond.throttle)

    def rerate(self, now: float) -> None:
        """Bring every running task's remaining work to ``now`` and give it its new rate and finish time."""
        self.version += 1
        bg, g = self.cond.background, max(self.spec.gpu_count, 1)
        self._bg = tuple(bg.get(r, 0.0) / (g if r in ("gpu", "membw") else 1) for r in RESOURCES)
        for run in self.running.values():
            run.advance(now)
            run.factor = self._factor(run)
            run.finish_s = now + run.left_ms * run.factor / 1000.0

    def start(self, idx: int, app: AppProfile, input_mb: float, work_ms: float, now: float) -> Running:
        """Bind a task (its requests fit) with ``work_ms`` of work; re-rates the node. Returns its record."""
        self._advance(now)
        p = app.place
        gpu = self.pick_gpu(app, input_mb) if p.gpu_share else -1
        if gpu is None:
            raise ValueError(f"{self.name}: no GPU has room for {app.name} ({input_mb:.1f} MB)")
        run = Running(idx, app.name, p, gpu, app.gpu_mem_gb(input_mb), work_ms, now)
        self.cpu_used += p.cpu_cores
        self.mem_used += p.mem_gb
        if gpu >= 0:
            self.gpu_shares[gpu] += p.gpu_share
            self.gpu_mem[gpu] += run.gpu_mem_gb
            self.gpu_demand[gpu][0] += p.d[GPU]
            self.gpu_demand[gpu][1] += p.d[MEMBW]
            apps = self.gpu_apps[gpu]
            apps[app.name] = apps.get(app.name, 0) + 1
        nd = self.node_demand
        for r in range(5):
            nd[r] += p.d[r]
        self._update_room()
        self.running[idx] = run
        self.rerate(now)
        run.start_factor = run.factor
        return run

    def end(self, run: Running, now: float) -> None:
        """The task finished (or is taken off) at ``now``: release its requests and re-rate the rest."""
        self._advance(now)
        run.advance(now)
        del self.running[run.idx]
        p = run.place
        self.cpu_used -= p.cpu_cores
        self.mem_used -= p.mem_gb
        if run.gpu >= 0:
            g = run.gpu
            self.gpu_shares[g] -= p.gpu_share
            self.gpu_mem[g] = max(0.0, self.gpu_mem[g] - run.gpu_mem_gb)
            self.gpu_demand[g][0] = max(0.0, self.gpu_demand[g][0] - p.d[GPU])
            self.gpu_demand[g][1] = max(0.0, self.gpu_demand[g][1] - p.d[MEMBW])
            self.gpu_apps[g][run.app] -= 1
        nd = self.node_demand
        for r in range(5):
            nd[r] = max(0.0, nd[r] - p.d[r])
        self._update_room()
        self.rerate(now)

    def next_finish(self) -> Running | None:
        return min(self.running.values(), key=lambda r: r.finish_s) if self.running else None

    def cost_if_started(self, app: AppProfile, input_mb: float, work_ms: float, now: float) -> tuple[float, float]:
        """(service ms of a new task with ``work_ms`` started at ``now``, ms it adds to the running tasks'
        remaining times), both assuming nothing else changes; the node's state is left as it was."""
        p = app.place
        gpu = self.pick_gpu(app, input_mb) if p.gpu_share else -1
        if gpu is None:
            return float("inf"), float("inf")
        left = [(r, r.left_now(now)) for r in self.running.values()]
        probe = Running(-1, app.name, p, gpu, 0.0, work_ms, now)
        self._add_demand(probe, +1)
        try:
            own = work_ms * self._factor(probe)
            inflicted = sum(x * (self._factor(r) - r.factor) for r, x in left)
        finally:
            self._add_demand(probe, -1)
        return own, inflicted

    def _add_demand(self, run: Running, sign: int) -> None:
        p = run.place
        if run.gpu >= 0:
            self.gpu_demand[run.gpu][0] += sign * p.d[GPU]
            self.gpu_demand[run.gpu][1] += sign * p.d[MEMBW]
            apps = self.gpu_apps[run.gpu]
            apps[run.app] = apps.get(run.app, 0) + sign
        for r in range(5):
            self.node_demand[r] += sign * p.d[r]

    def expected_ms(self, app: AppProfile, input_mb: float) -> float:
        """Service time of a task starting now with no noise, if nothing else changed while it ran."""
        return self.cost_if_started(app, input_mb, self.ideal_ms(app, input_mb), self.last_t)[0]

    # -- utilisation
    def gpu_util(self) -> float:
        """GPU compute demand of tasks and background over the node's GPUs (0..1)."""
        if not self.spec.gpu_count:
            return 0.0
        d = sum(x[0] for x in self.gpu_demand) + self.cond.background.get("gpu", 0.0)
        return min(1.0, d / self.spec.gpu_count)

    def cpu_util(self) -> float:
        return min(1.0, (self.node_demand[CPU] + self.cond.background.get("cpu", 0.0)) / self.spec.cpu_cores)

    def _advance(self, now: float) -> None:
        dt = now - self.last_t
        if dt > 0:
            busy = sum(1 for s in self.gpu_shares if s > 0)
            self.gpu_busy_area += busy * dt
            self.busy_area += dt if self.running else 0.0
            self.gpu_demand_area += self.gpu_util() * dt
            area, nd = self.area, self.node_demand
            for i, r in enumerate(RESOURCES):
                area[r] += nd[i] * dt
            area["streams"] += self.gpu_tasks * dt
            self.last_t = now

    def interval_demand(self, now: float) -> dict[str, float]:
        """Mean task demand per resource (and running GPU tasks, ``streams``) since the previous call.

        What an exporter's rate or utilisation counter shows over one scrape interval.
        """
        self._advance(now)
        span = now - self._mark_t
        if span <= 0:
            out = dict(zip(RESOURCES, self.node_demand, strict=True))
            out["streams"] = float(self.gpu_tasks)
        else:
            out = {k: (v - self._mark[k]) / span for k, v in self.area.items()}
        self._mark = dict(self.area)
        self._mark_t = now
        return out

    # -- membership and condition
    def join(self, now: float) -> None:
        """The node joins the cluster at ``now``: integrals start here."""
        self.joined = True
        self.last_t = now
        self._mark_t = now

    def cordon(self, now: float) -> None:
        """The node leaves: no new task is bound to it; running ones finish. Integrals stop here."""
        self._advance(now)
        self.cordoned = True
        self.left_s = now

    def set_condition(self, now: float) -> None:
        """Call before an event changes :attr:`cond`, so utilisation integrals stay exact."""
        self._advance(now)


__all__ = ["EPS", "NodeRuntime", "Running", "interference"]
