"""The two simplest baselines: round-robin and uniform random over the candidates.

>>> from app.sim.hardware import small_preset
>>> nodes = small_preset()
>>> rr = RoundRobin()
>>> [rr.choose(None, nodes[:3], None).name for _ in range(4)]  # type: ignore[arg-type]
['worker-1', 'worker-2', 'worker-3', 'worker-1']
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.sim.hardware import NodeSpec
from app.sim.policies.base import BasePolicy
from app.sim.view import ClusterView, Task


class RoundRobin(BasePolicy):
    """Cycles through the cluster's nodes in name order, taking the next one that is a candidate."""

    name = "round_robin"

    def __init__(self) -> None:
        super().__init__()
        self._next = 0

    def choose(self, task: Task, candidates: Sequence[NodeSpec], view: ClusterView) -> NodeSpec:
        # candidates keep the cluster's node order; a global counter over it spreads tasks evenly
        node = candidates[self._next % len(candidates)]
        self._next += 1
        return node


class RandomChoice(BasePolicy):
    """Uniformly random candidate, from an injected generator."""

    name = "random"

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__()
        self._rng = rng

    def choose(self, task: Task, candidates: Sequence[NodeSpec], view: ClusterView) -> NodeSpec:
        return candidates[int(self._rng.integers(len(candidates)))]
