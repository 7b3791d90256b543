"""The clairvoyant reference: greedy placement with the simulator's ground truth.

For each candidate it knows the task's true work there (its noise draw included), the node's rate model
and the state of every task running on it (:meth:`ClusterView.clairvoyant_cost`), and picks the node that
minimises the task's own service time plus the time it would add to the tasks already running there,
both as if nothing else changed.

It is a strong reference, not a bound: it is greedy (it neither looks at later arrivals nor holds a fast
node back for them), it ignores the tasks still waiting in the queue, and the "nothing else changes"
estimate is wrong as soon as another task starts or ends. A policy can beat it on a seed, and in a
saturated cluster a policy that trades a task's own time against its neighbours' differently can too.
What it shows is how much room a scenario leaves for a placement policy.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.sim.hardware import NodeSpec
from app.sim.policies.base import BasePolicy
from app.sim.view import ClusterView, Task


class Clairvoyant(BasePolicy):
    """``argmin own_ms + inflicted_ms``; ties go to the first candidate (the cluster's node order).

    Candidates are visited by their task's work there (a lower bound of the cost: rates never exceed 1 and
    a start never speeds a neighbour up), stopping once that bound reaches the best cost found.
    """

    name = "clairvoyant"

    def __init__(self, inflicted_weight: float = 1.0) -> None:
        super().__init__()
        if inflicted_weight < 0:
            raise ValueError(f"Clairvoyant.inflicted_weight: must be >= 0 (got {inflicted_weight})")
        self.inflicted_weight = inflicted_weight

    def choose(self, task: Task, candidates: Sequence[NodeSpec], view: ClusterView) -> NodeSpec:
        best = (float("inf"), len(candidates), float("nan"))  # (cost, candidate index, own ms)
        for lb, i in sorted((view.true_work_ms(task, n.name), i) for i, n in enumerate(candidates)):
            if lb > best[0]:
                break
            own, inflicted = view.clairvoyant_cost(task, candidates[i].name)
            cost = own + self.inflicted_weight * inflicted
            if (cost, i) < best[:2]:
                best = (cost, i, own)
        if best[1] == len(candidates):  # no finite cost anywhere: the first candidate
            return candidates[0]
        self.trace.predicted_ms[task.idx] = (view.now - task.submit_s) * 1000.0 + best[2]
        return candidates[best[1]]
