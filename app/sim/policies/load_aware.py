"""A load-aware peer: Trimaran's LoadVariationRiskBalancing (kubernetes-sigs/scheduler-plugins).

Per resource (CPU, memory), from the load-watcher's average and standard deviation of the node's
utilisation (:mod:`app.sim.policies.loadwatcher`), as ``pkg/trimaran/resourcestats.go`` (``GetMuSigma``)
and ``pkg/trimaran/loadvariationriskbalancing/analysis.go`` (``computeScore``) compute it:

``mu = clamp((avg_used + pod_request) / capacity)``, ``sigma = clamp(std_used / capacity)``,
``sigma = clamp(margin * sigma ** (1 / sensitivity))``, ``risk = (mu + sigma) / 2``,
``score = (1 - risk) * 100``

and the node takes the lower of its CPU and memory scores, rounded (``loadvariationriskbalancing.go``);
a node without metrics scores 0 (``MinNodeScore``). Defaults as upstream: margin 1, sensitivity 1.

The plugin is enabled *in addition to* the default profile (the README's KubeSchedulerConfiguration
enables it without disabling anything), so a node's total is NodeResourcesFit + BalancedAllocation
(:mod:`~app.sim.policies.kube_default`) + LoadVariationRiskBalancing, all weight 1, random tie-break.

>>> float(lvrb_score(0.5, 0.1, 0.0))  # mu 0.5, sigma 0.1 -> risk 0.3
70.0
>>> float(lvrb_score(0.2, 0.04, 0.25, margin=1.0, sensitivity=2.0))  # sigma = sqrt(0.04) = 0.2
67.5
>>> lvrb_score(np.array([0.9, 0.1]), np.array([0.0, 0.0]), np.array([0.2, 0.2])).tolist()  # mu clamped to 1
[50.0, 85.0]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import ArrayLike

from app.sim.hardware import NodeSpec
from app.sim.policies.base import BasePolicy
from app.sim.policies.kube_default import DefaultScorer, select_host
from app.sim.policies.loadwatcher import FETCH_S, REFRESH_S, WINDOW_S, LoadWatcher
from app.sim.view import ClusterView, Task


def lvrb_score(used_avg: ArrayLike, used_std: ArrayLike, request: ArrayLike, *, margin: float = 1.0,
               sensitivity: float = 1.0) -> np.ndarray:
    """``computeScore`` for one resource (elementwise over nodes), inputs as fractions of capacity (0..100)."""
    mu = np.clip(np.clip(used_avg, 0.0, 1.0) + np.maximum(request, 0.0), 0.0, 1.0)
    sigma = np.clip(used_std, 0.0, 1.0)
    if sensitivity > 0:
        sigma = sigma ** (1.0 / sensitivity)
    elif sensitivity == 0:  # Go: math.Pow(sigma, +Inf)
        sigma = np.where(sigma >= 1.0, 1.0, 0.0)
    sigma = np.clip(sigma * margin, 0.0, 1.0)
    return (1.0 - (mu + sigma) / 2.0) * 100.0


def go_round(x: float) -> int:
    """Go's ``math.Round`` (half away from zero)."""
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def scrape_utilisation(metrics: Mapping[str, float]) -> tuple[float, float]:
    """(CPU, memory) utilisation of one scrape, as the Prometheus rules the load-watcher queries define them."""
    return 1.0 - metrics.get("cpu_idle", 1.0), metrics.get("memory_used_fraction", 0.0)


class LoadAware(BasePolicy):
    """LoadVariationRiskBalancing plus the default profile; see the module docstring."""

    name = "load_aware"

    def __init__(self, rng: np.random.Generator, *, margin: float = 1.0, sensitivity: float = 1.0,
                 fetch_s: float = FETCH_S, refresh_s: float = REFRESH_S, window_s: float = WINDOW_S,
                 with_defaults: bool = True, name: str = "load_aware") -> None:
        super().__init__()
        self.name = name
        if margin < 0:
            raise ValueError(f"LoadAware.margin: must be >= 0 (got {margin})")
        self._rng = rng
        self.margin = margin
        self.sensitivity = sensitivity
        self.with_defaults = with_defaults
        self.watcher = LoadWatcher(fetch_s, refresh_s, window_s)
        self._defaults = DefaultScorer()
        self._cached_for: float | None = None
        self._cache: dict[tuple[str, str], int] = {}  # (app, node) -> score, for the snapshot held

    def observe_metrics(self, node: str, ts: float, metrics: Mapping[str, float], view: ClusterView) -> None:
        cpu, mem = scrape_utilisation(metrics)
        self.watcher.observe(node, view.now, cpu, mem)

    def lvrb(self, task: Task, nodes: Sequence[NodeSpec], view: ClusterView) -> list[int]:
        """The plugin's score of each node: min of the CPU and memory scores, rounded; 0 without metrics.

        It depends only on the polled snapshot and the pod's requests, so it is kept per snapshot and app."""
        now = view.now
        snapshot = self.watcher.snapshot_at(now)
        if snapshot != self._cached_for:
            self._cached_for, self._cache = snapshot, {}
        cache, app = self._cache, task.app
        missing = [n for n in nodes if (app, n.name) not in cache]
        if missing:
            for n, score in zip(missing, self._lvrb(task, missing, now).tolist(), strict=True):
                cache[(app, n.name)] = score
        return [cache[(app, n.name)] for n in nodes]

    def _lvrb(self, task: Task, nodes: Sequence[NodeSpec], now: float) -> np.ndarray:
        stats = [self.watcher.stats(n.name, now) for n in nodes]
        have = [i for i, st in enumerate(stats) if st is not None]
        out = np.zeros(len(nodes), dtype=np.int64)
        if not have:
            return out
        p = task.profile.place
        rows = np.array([(st.cpu_avg, st.cpu_std, st.mem_avg, st.mem_std, nodes[i].cpu_cores, nodes[i].mem_gb)
                         for i in have for st in (stats[i],) if st is not None])
        cpu = lvrb_score(rows[:, 0], rows[:, 1], p.cpu_cores / rows[:, 4], margin=self.margin,
                         sensitivity=self.sensitivity)
        mem = lvrb_score(rows[:, 2], rows[:, 3], p.mem_gb / rows[:, 5], margin=self.margin,
                         sensitivity=self.sensitivity)
        out[have] = np.floor(np.minimum(cpu, mem) + 0.5)  # Go's math.Round, scores are >= 0
        return out

    def choose(self, task: Task, candidates: Sequence[NodeSpec], view: ClusterView) -> NodeSpec:
        scores = self.lvrb(task, candidates, view)
        if self.with_defaults:
            scores = [a + b for a, b in zip(scores, self._defaults.scores(task, candidates, view), strict=True)]
        return select_host(candidates, scores, self._rng)


TUNED: dict[str, float] = {"fetch_s": 1.0, "refresh_s": 0.5, "window_s": 15.0, "margin": 1.0, "sensitivity": 1.0}
"""``load_aware_tuned``: the watcher's timing scaled to the scenarios' time scale and the plugin's knobs, as
``bench/bench_trimaran_grid.py`` chose them on held-out seeds (6-8; docs/simulator.md, **The Trimaran
baselines' timing and knobs**)."""


def load_aware_tuned(rng: np.random.Generator) -> LoadAware:
    t = TUNED
    return LoadAware(rng, margin=t["margin"], sensitivity=t["sensitivity"], fetch_s=t["fetch_s"],
                     refresh_s=t["refresh_s"], window_s=t["window_s"], name="load_aware_tuned")
