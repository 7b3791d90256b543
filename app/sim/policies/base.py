"""No-op feedback hooks for the policies of :mod:`app.sim.policies` (the seam is :mod:`app.sim.policy`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from app.sim.hardware import NodeSpec
from app.sim.policy import PolicyTrace
from app.sim.view import ClusterView, Task


class BasePolicy:
    """No-op feedback hooks; subclasses implement :meth:`choose`."""

    name = "base"

    def __init__(self) -> None:
        self.trace = PolicyTrace()

    def choose(self, task: Task, candidates: Sequence[NodeSpec], view: ClusterView) -> NodeSpec | None:
        raise NotImplementedError

    def observe_metrics(self, node: str, ts: float, metrics: Mapping[str, float], view: ClusterView) -> None:
        return None

    def observe_completion(self, task: Task, node: str, rtt_ms: float, view: ClusterView) -> None:
        return None

    def tick(self, view: ClusterView) -> None:
        return None
