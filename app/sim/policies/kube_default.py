"""Kubernetes' default scoring: NodeResourcesFit LeastAllocated + NodeResourcesBalancedAllocation.

Both look only at *requested* resources (CPU, memory, and GPU shares where the node has GPUs and the task
asks for one), never at live load or hardware speed. Per resource ``r`` after placing the pod:
``least = 100 * (allocatable - requested) / allocatable`` averaged over resources, and
``balanced = 100 * (1 - std(requested / allocatable))``; the node score is their sum, and ties are broken
at random as kube-scheduler's ``selectHost`` does.

>>> kube_score([(0.0, 32.0), (0.0, 128.0)])
200.0
>>> kube_score([(16.0, 32.0), (0.0, 128.0)]) < kube_score([(8.0, 32.0), (32.0, 128.0)])
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from app.sim.hardware import NodeSpec
from app.sim.policies.base import BasePolicy
from app.sim.view import ClusterView, Task


def kube_score(used_over_alloc: Sequence[tuple[float, float]]) -> float:
    """LeastAllocated + BalancedAllocation for ``(requested_after, allocatable)`` per resource (0..200)."""
    fracs = [min(1.0, u / a) for u, a in used_over_alloc if a > 0]
    if not fracs:
        return 0.0
    least = 100.0 * sum(1.0 - f for f in fracs) / len(fracs)
    mean = sum(fracs) / len(fracs)
    std = math.sqrt(sum((f - mean) ** 2 for f in fracs) / len(fracs))
    return least + 100.0 * (1.0 - std)


class KubeDefault(BasePolicy):
    name = "kube_default"

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__()
        self._rng = rng

    def choose(self, task: Task, candidates: Sequence[NodeSpec], view: ClusterView) -> NodeSpec:
        best: list[NodeSpec] = []
        best_score = -1.0
        for node in candidates:
            cpu, mem, gpu = view.requested(node.name)
            p = task.profile.placement(node)
            res = [(cpu + p.cpu_cores, float(node.cpu_cores)), (mem + p.mem_gb, node.mem_gb)]
            if p.gpu_share:
                res.append((float(gpu + p.gpu_share), float(node.gpu_shares)))
            s = kube_score(res)
            if s > best_score + 1e-9:
                best, best_score = [node], s
            elif abs(s - best_score) <= 1e-9:
                best.append(node)
        return best[0] if len(best) == 1 else best[int(self._rng.integers(len(best)))]
