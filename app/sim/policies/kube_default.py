"""Kubernetes' default scoring of a pod's feasible nodes, as kube-scheduler computes it.

The default profile (``pkg/scheduler/apis/config/v1/default_plugins.go``) scores with NodeResourcesFit
(weight 1, scoring strategy LeastAllocated) and NodeResourcesBalancedAllocation (weight 1), both on
``cpu`` and ``memory`` with weight 1 each (``resource_allocation.go``: ``defaultRequestedRatioResources``),
from *requested* resources - the node's pods plus this pod - never live load or hardware speed:

- LeastAllocated (``least_allocated.go``): per resource ``((capacity - requested) * 100) / capacity`` in
  int64 (0 when requested > capacity), CPU in millicores and memory in bytes; node score
  ``sum(score * weight) / sum(weight)``, integer division.
- BalancedAllocation (``balanced_allocation.go``): ``fraction = min(1, requested / allocatable)`` per
  resource; with two resources ``std = |f_cpu - f_mem| / 2``; score ``int64((1 - std) * 100)``.

The node's total is their weighted sum (0..200). The other default score plugins (TaintToleration,
NodeAffinity, PodTopologySpread, InterPodAffinity, ImageLocality) score every node alike here - no taints,
affinities, spread constraints on Job pods, images everywhere - and are left out. ``selectHost`` picks
uniformly among the nodes with the top score (reservoir sampling). Extended resources
(``nvidia.com/gpu``) are filtered on, not scored, in the default profile.

Scores are computed for all candidates at once (rows = nodes), with int64 and float64 arithmetic as the
Go code has it.

>>> least_allocated([[16_000, 8 << 30]], [[32_000, 128 << 30]])  # (50 + 93) // 2
array([71])
>>> balanced_allocation([[16_000, 8 << 30]], [[32_000, 128 << 30]])  # std = (0.5 - 0.0625) / 2
array([78])
>>> kube_score([[16_000, 8 << 30], [2_000, 2 << 30]], [[32_000, 128 << 30], [8_000, 32 << 30]])
array([149, 174])
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from app.sim.hardware import NodeSpec
from app.sim.policies.base import BasePolicy
from app.sim.view import ClusterView, Task

MAX_NODE_SCORE = 100
GIB = 1 << 30
WEIGHT_FIT = 1  # NodeResourcesFit in default_plugins.go
WEIGHT_BALANCED = 1  # NodeResourcesBalancedAllocation in default_plugins.go


def _arrays(requested: ArrayLike, allocatable: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    return np.atleast_2d(np.asarray(requested, dtype=np.int64)), np.atleast_2d(np.asarray(allocatable, dtype=np.int64))


def _least(req: np.ndarray, cap: np.ndarray, weights: Sequence[int]) -> np.ndarray:
    if tuple(weights) == (1, 1) and req.shape[1] == 2 and cap.min() > 0:  # the default profile, in one go
        per = np.maximum(((cap - req) * MAX_NODE_SCORE) // cap, 0)  # negative exactly when requested > capacity
        return (per[:, 0] + per[:, 1]) // 2
    ok = (cap > 0) & (req <= cap)
    per = np.where(ok, ((cap - req) * MAX_NODE_SCORE) // np.maximum(cap, 1), 0)
    total = sum(weights)
    if not total:
        return np.zeros(len(req), dtype=np.int64)
    return (per @ np.asarray(weights, dtype=np.int64)) // total


def _balanced(req: np.ndarray, cap: np.ndarray) -> np.ndarray:
    if req.shape[1] == 2 and (cap != 0).all():  # the default profile's case, in one go
        f = np.minimum(1.0, req / cap)  # float64, as Go's float64(requested) / float64(allocatable)
        return ((1 - np.abs((f[:, 0] - f[:, 1]) / 2)) * MAX_NODE_SCORE).astype(np.int64)
    out = np.empty(len(req), dtype=np.int64)
    for i in range(len(req)):
        fr = [min(1.0, float(r) / float(a)) for r, a in zip(req[i], cap[i], strict=True) if a != 0]
        std = 0.0
        if len(fr) == 2:
            std = abs((fr[0] - fr[1]) / 2)
        elif len(fr) > 2:
            mean = sum(fr) / len(fr)
            std = math.sqrt(sum((x - mean) * (x - mean) for x in fr) / len(fr))
        out[i] = int((1 - std) * MAX_NODE_SCORE)
    return out


def least_allocated(requested: ArrayLike, allocatable: ArrayLike, weights: Sequence[int] = (1, 1)) -> np.ndarray:
    """``leastResourceScorer`` per node: per resource ``leastRequestedScore`` (0 when requested > capacity or
    capacity is 0, else ``((capacity - requested) * 100) // capacity``), weighted mean by integer division."""
    return _least(*_arrays(requested, allocatable), weights)


def balanced_allocation(requested: ArrayLike, allocatable: ArrayLike) -> np.ndarray:
    """``balancedResourceScorer`` per node: ``int64((1 - std) * 100)`` of ``min(1, requested / allocatable)``;
    with two resources ``std = |f1 - f2| / 2``, else the population standard deviation (resources with
    allocatable 0 are skipped)."""
    return _balanced(*_arrays(requested, allocatable))


def kube_score(requested: ArrayLike, allocatable: ArrayLike) -> np.ndarray:
    """Default-profile score per node (0..200); ``requested`` = the node's pods + this pod (cpu m, bytes)."""
    req, cap = _arrays(requested, allocatable)
    return WEIGHT_FIT * _least(req, cap, (1, 1)) + WEIGHT_BALANCED * _balanced(req, cap)


class DefaultScorer:
    """The default profile's scores of a pod's candidates. A node's score depends only on what is requested
    there and by the pod, so scores are memoised on that (exactly the same numbers, computed once)."""

    def __init__(self) -> None:
        self._memo: dict[tuple[str, float, float, float, float], int] = {}

    def scores(self, task: Task, nodes: Sequence[NodeSpec], view: ClusterView) -> list[int]:
        """Score of every node in ``nodes`` for ``task``: requested = the node's pods + this pod."""
        place = task.profile.place
        cpu, mem = view.requested_many([n.name for n in nodes])
        keys = [(n.name, c, m, place.cpu_cores, place.mem_gb) for n, c, m in zip(nodes, cpu, mem, strict=True)]
        memo = self._memo
        missing = [i for i, k in enumerate(keys) if k not in memo]
        if missing:
            if len(memo) > 100_000:
                memo.clear()
            requested = [(round((cpu[i] + place.cpu_cores) * 1000), round((mem[i] + place.mem_gb) * GIB))
                         for i in missing]
            allocatable = [(nodes[i].cpu_cores * 1000, round(nodes[i].mem_gb * GIB)) for i in missing]
            for i, score in zip(missing, kube_score(requested, allocatable).tolist(), strict=True):
                memo[keys[i]] = score
        return [memo[k] for k in keys]


def select_host(nodes: Sequence[NodeSpec], scores: Sequence[float], rng: np.random.Generator) -> NodeSpec:
    """kube-scheduler's ``selectHost``: a uniformly random node among those with the top score."""
    best = max(scores)
    top = [i for i, s in enumerate(scores) if s == best]
    return nodes[top[0]] if len(top) == 1 else nodes[top[int(rng.integers(len(top)))]]


class KubeDefault(BasePolicy):
    """The default profile's scoring (see the module docstring): the "before" of the seed's table."""

    name = "kube_default"

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__()
        self._rng = rng
        self._scorer = DefaultScorer()

    def choose(self, task: Task, candidates: Sequence[NodeSpec], view: ClusterView) -> NodeSpec:
        return select_host(candidates, self._scorer.scores(task, candidates, view), self._rng)
