"""The live state of one simulated node: what is allocated, what load its tasks put on shared resources.

Requests (CPU cores, host memory, GPU shares, GPU memory) decide whether a task *fits*; demands (load per
resource) decide how much co-located tasks slow each other and what the exporters see. Time integrals of
GPU and CPU utilisation are kept as tasks come and go, for the run's utilisation figures.

>>> from app.sim.hardware import small_preset
>>> from app.sim.apps import APPS
>>> rt = NodeRuntime(small_preset()[2], 2)
>>> rt.has_room(APPS["gCTF"], 80.0)
True
>>> rt.allocate(APPS["gCTF"], 80.0, now=0.0); rt.loads()["gpu"]
0.5
>>> rt.release(APPS["gCTF"], 80.0, now=2.0); rt.gpu_area
1.0
"""

from __future__ import annotations

from app.sim.apps import RESOURCES, AppProfile, contention_factor, ms_per_mb
from app.sim.events import NodeCondition
from app.sim.hardware import NodeSpec

EPS = 1e-9


class NodeRuntime:
    __slots__ = ("spec", "idx", "name", "cpu_used", "mem_used", "gpu_shares_used", "gpu_mem_used", "gpu_tasks",
                 "demand", "running", "cond", "joined", "gpu_area", "cpu_area", "last_t", "placed_since_scrape",
                 "_gpu_units", "_gpu_mem_cap", "_per_mb", "area", "_mark", "_mark_t")

    def __init__(self, spec: NodeSpec, idx: int) -> None:
        self.spec = spec
        self.idx = idx
        self.name = spec.name
        self.cpu_used = 0.0
        self.mem_used = 0.0
        self.gpu_shares_used = 0
        self.gpu_mem_used = 0.0
        self.gpu_tasks = 0
        self.demand = dict.fromkeys(RESOURCES, 0.0)
        self.running = 0
        self.cond = NodeCondition()
        self.joined = spec.join_at_s <= 0
        self.gpu_area = 0.0
        self.cpu_area = 0.0
        self.last_t = 0.0
        self.placed_since_scrape = 0
        self._gpu_units = float(max(spec.gpu_count, 1))
        self._gpu_mem_cap = (spec.gpu.mem_gb * spec.gpu_count) if spec.gpu else 0.0
        self._per_mb: dict[str, float] = {}
        self.area = dict.fromkeys((*RESOURCES, "streams"), 0.0)  # time integrals of task demand
        self._mark = dict(self.area)
        self._mark_t = 0.0

    # -- capacity
    def has_room(self, app: AppProfile, input_mb: float) -> bool:
        """True when the task's requests fit in what is free now (the caller checked :meth:`AppProfile.fits`)."""
        p = app.placement(self.spec)
        s = self.spec
        if self.cpu_used + p.cpu_cores > s.cpu_cores + EPS or self.mem_used + p.mem_gb > s.mem_gb + EPS:
            return False
        if p.gpu_share:
            if self.gpu_shares_used + p.gpu_share > s.gpu_shares:
                return False
            if self.gpu_mem_used + app.gpu_mem_gb(input_mb) > self._gpu_mem_cap + EPS:
                return False
        return True

    # -- utilisation
    def gpu_util(self) -> float:
        """True GPU utilisation (0..1): task and background GPU demand over the node's GPUs."""
        if not self.spec.gpu_count:
            return 0.0
        return min(1.0, (self.demand["gpu"] + self.cond.background.get("gpu", 0.0)) / self._gpu_units)

    def cpu_util(self) -> float:
        return min(1.0, (self.demand["cpu"] + self.cond.background.get("cpu", 0.0)) / self.spec.cpu_cores)

    def _advance(self, now: float) -> None:
        dt = now - self.last_t
        if dt > 0:
            self.gpu_area += self.gpu_util() * dt
            self.cpu_area += self.cpu_util() * dt
            area, d = self.area, self.demand
            for r in RESOURCES:
                area[r] += d[r] * dt
            area["streams"] += self.gpu_tasks * dt
            self.last_t = now

    def loads(self) -> dict[str, float]:
        """Load on each shared resource from running tasks and background, normalised to one unit."""
        bg = self.cond.background
        d = self.demand
        g = self._gpu_units
        return {
            "gpu": (d["gpu"] + bg.get("gpu", 0.0)) / g,
            "membw": (d["membw"] + bg.get("membw", 0.0)) / g,
            "pcie": d["pcie"] + bg.get("pcie", 0.0),
            "disk": d["disk"] + bg.get("disk", 0.0),
            "cpu": (d["cpu"] + bg.get("cpu", 0.0)) / self.spec.cpu_cores,
        }

    def expected_ms(self, app: AppProfile, input_mb: float) -> float:
        """Expected service time of a task starting now (contention, throttling, slowdown; no noise)."""
        per_mb = self._per_mb.get(app.name)
        if per_mb is None:
            per_mb = self._per_mb[app.name] = ms_per_mb(app, self.spec)
        place = app.placement(self.spec)
        t = (place.overhead_ms + input_mb * per_mb) * contention_factor(place, self.loads()) * self.cond.slowdown
        return t * self.cond.throttle if place.throttle_sensitive else t

    def interval_demand(self, now: float) -> dict[str, float]:
        """Mean task demand per resource (and running GPU tasks, ``streams``) since the previous call.

        What an exporter's rate or utilisation counter shows over one scrape interval.
        """
        self._advance(now)
        span = now - self._mark_t
        if span <= 0:
            out = dict(self.demand)
            out["streams"] = float(self.gpu_tasks)
        else:
            out = {k: (v - self._mark[k]) / span for k, v in self.area.items()}
        self._mark = dict(self.area)
        self._mark_t = now
        return out

    # -- allocation
    def allocate(self, app: AppProfile, input_mb: float, now: float) -> None:
        self._advance(now)
        p = app.placement(self.spec)
        self.cpu_used += p.cpu_cores
        self.mem_used += p.mem_gb
        if p.gpu_share:
            self.gpu_shares_used += p.gpu_share
            self.gpu_mem_used += app.gpu_mem_gb(input_mb)
            self.gpu_tasks += 1
        for r, v in p.demand.items():
            self.demand[r] += v
        self.running += 1

    def release(self, app: AppProfile, input_mb: float, now: float) -> None:
        self._advance(now)
        p = app.placement(self.spec)
        self.cpu_used -= p.cpu_cores
        self.mem_used -= p.mem_gb
        if p.gpu_share:
            self.gpu_shares_used -= p.gpu_share
            self.gpu_mem_used -= app.gpu_mem_gb(input_mb)
            self.gpu_tasks -= 1
        for r, v in p.demand.items():
            self.demand[r] = max(0.0, self.demand[r] - v)
        self.running -= 1

    def join(self, now: float) -> None:
        """The node joins the cluster at ``now``: integrals start here."""
        self.joined = True
        self.last_t = now
        self._mark_t = now

    def set_condition(self, now: float) -> None:
        """Call before an event changes :attr:`cond`, so utilisation integrals stay exact."""
        self._advance(now)
