"""The oracle: places each task where its *true* expected service time is lowest right now.

It reads the simulator's ground truth (:meth:`ClusterView.expected_ms`: hardware, contention, throttling,
hidden slowdowns), so it bounds what any predictor-driven greedy policy can reach; it does not see the
noise draw, and it is greedy (it does not hold fast nodes back for later tasks).
"""

from __future__ import annotations

from collections.abc import Sequence

from app.sim.hardware import NodeSpec
from app.sim.policies.base import BasePolicy
from app.sim.view import ClusterView, Task


class Oracle(BasePolicy):
    name = "oracle"

    def choose(self, task: Task, candidates: Sequence[NodeSpec], view: ClusterView) -> NodeSpec:
        best = candidates[0]
        best_ms = view.expected_ms(task, best.name)
        for node in candidates[1:]:
            ms = view.expected_ms(task, node.name)
            if ms < best_ms:
                best, best_ms = node, ms
        self.trace.predicted_ms[task.idx] = best_ms
        return best
