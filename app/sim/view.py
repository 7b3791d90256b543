"""What a placement policy may see: the task, and a read-only view of the cluster.

Policies see what a real scheduler could know - node hardware, requested resources (the scheduler's own
bookkeeping), the pods it placed that still run, pods it just placed; scraped metrics reach a policy through
its ``observe_metrics`` hook. The simulator's ground truth (:meth:`ClusterView.clairvoyant_cost`,
:meth:`ClusterView.expected_ms`) is for the clairvoyant reference only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from app.sim.apps import APPS, AppProfile
from app.sim.hardware import NodeSpec
from app.sim.state import NodeRuntime


class Task:
    """One task: identity, app, input size, its arrival, and its pre-drawn noise (standard normal)."""

    __slots__ = ("idx", "task_id", "app", "profile", "input_mb", "submit_s", "noise_z")

    def __init__(self, idx: int, app: str, input_mb: float, submit_s: float, noise_z: float) -> None:
        self.idx = idx
        self.task_id = f"t{idx:07d}"
        self.app = app
        self.profile: AppProfile = APPS[app]
        self.input_mb = input_mb
        self.submit_s = submit_s
        self.noise_z = noise_z

    def __repr__(self) -> str:
        return f"Task({self.task_id}, {self.app}, {self.input_mb:.1f} MB)"


class ClusterView:
    """Read-only view over the simulated cluster (names are node names)."""

    def __init__(self, runtimes: Mapping[str, NodeRuntime], now: Callable[[], float], start_ts: float) -> None:
        self._rt = runtimes
        self._now = now
        self.start_ts = start_ts

    # -- time
    @property
    def now(self) -> float:
        """Simulated seconds since the start of the run."""
        return self._now()

    @property
    def ts(self) -> float:
        """Unix seconds of the simulated now (what messages carry)."""
        return self.start_ts + self._now()

    # -- nodes
    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        return tuple(rt.spec for rt in self._rt.values() if rt.joined and not rt.cordoned)

    def node(self, name: str) -> NodeSpec:
        return self._rt[name].spec

    def requested(self, name: str) -> tuple[float, float, int]:
        """(CPU cores, host memory GB, GPU shares) requested by the tasks running on ``name``."""
        rt = self._rt[name]
        return rt.cpu_used, rt.mem_used, rt.gpu_shares_used

    def requested_many(self, names: Sequence[str]) -> tuple[list[float], list[float]]:
        """(CPU cores, host memory GB) requested on each of ``names``, for scoring many nodes at once."""
        rts = [self._rt[n] for n in names]
        return [rt.cpu_used for rt in rts], [rt.mem_used for rt in rts]

    def running_many(self, names: Sequence[str]) -> list[int]:
        """:meth:`running` of each of ``names``."""
        return [len(self._rt[n].running) for n in names]

    def running(self, name: str) -> int:
        """Tasks running on ``name`` (bound pods the scheduler placed there that have not finished)."""
        return len(self._rt[name].running)

    def placed_since_scrape(self, name: str) -> int:
        """Tasks placed on ``name`` since its last scrape (metrics do not show them yet)."""
        return self._rt[name].placed_since_scrape

    # -- ground truth (clairvoyant only)
    def expected_ms(self, task: Task, name: str) -> float:
        """The true service time of ``task`` (without its noise) if it started on ``name`` now and nothing
        else changed while it ran."""
        return self._rt[name].expected_ms(task.profile, task.input_mb)

    def true_work_ms(self, task: Task, name: str) -> float:
        """``task``'s work on ``name`` (ms at full speed, its noise draw included): a lower bound of its time."""
        return self._rt[name].work_ms(task.profile, task.input_mb, task.noise_z)

    def clairvoyant_cost(self, task: Task, name: str) -> tuple[float, float]:
        """(true service ms of ``task`` - its noise draw included - if started on ``name`` now, ms it would add
        to the remaining times of the tasks running there), assuming nothing else changes."""
        rt = self._rt[name]
        return rt.cost_if_started(task.profile, task.input_mb, rt.work_ms(task.profile, task.input_mb,
                                                                          task.noise_z), self._now())
