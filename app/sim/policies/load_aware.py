"""A load-aware peer: Trimaran's LoadVariationRiskBalancing on live CPU and GPU utilisation.

From the node's recent scrapes, per resource: ``mu`` = mean utilisation plus what this pod and the pods
placed since the last scrape request (as a fraction of the node), ``sigma`` = standard deviation of the
utilisation; ``risk = (mu + sigma) / 2`` and the node scores ``100 * (1 - risk)`` on its worst resource.
A node without metrics scores 0 (Trimaran's behaviour on missing data). It sees load, not hardware speed.

>>> lvrb_score([(0.2, 0.0)]), lvrb_score([(0.2, 0.0), (0.9, 0.1)])
(90.0, 50.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from app.sim.hardware import NodeSpec
from app.sim.policies.base import BasePolicy
from app.sim.view import ClusterView, Task

WINDOW_SCRAPES = 5


def lvrb_score(mu_sigma: Sequence[tuple[float, float]]) -> float:
    """0..100: ``100 * (1 - (mu + sigma) / 2)`` on the riskiest resource; inputs are clamped to [0, 1]."""
    worst = 0.0
    for mu, sigma in mu_sigma:
        risk = (min(1.0, max(0.0, mu)) + min(1.0, max(0.0, sigma))) / 2.0
        worst = max(worst, risk)
    return 100.0 * (1.0 - worst)


def _mean_std(xs: Sequence[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


class LoadAware(BasePolicy):
    name = "load_aware"

    def __init__(self, rng: np.random.Generator) -> None:
        super().__init__()
        self._rng = rng

    def _score(self, task: Task, node: NodeSpec, view: ClusterView) -> float:
        hist = list(view.metric_history(node.name))[-WINDOW_SCRAPES:]
        if not hist:
            return 0.0
        p = task.profile.placement(node)
        placed = view.placed_since_scrape(node.name) + 1
        cpu = [1.0 - m.get("cpu_idle", 1.0) for m in hist]
        mu, sd = _mean_std(cpu)
        parts = [(mu + placed * p.cpu_cores / node.cpu_cores, sd)]
        if p.gpu_share and node.gpu_shares:
            gpu = [m.get("nvidia_smi_utilization_gpu", 0.0) for m in hist]
            mu, sd = _mean_std(gpu)
            parts.append((mu + placed * p.gpu_share / node.gpu_shares, sd))
        return lvrb_score(parts)

    def choose(self, task: Task, candidates: Sequence[NodeSpec], view: ClusterView) -> NodeSpec:
        best: list[NodeSpec] = []
        best_score = -1.0
        for node in candidates:
            s = self._score(task, node, view)
            if s > best_score + 1e-9:
                best, best_score = [node], s
            elif abs(s - best_score) <= 1e-9:
                best.append(node)
        return best[0] if len(best) == 1 else best[int(self._rng.integers(len(best)))]
