"""The RTT-aware policy: this project's production pipeline, driven by the simulator's messages.

- every scrape goes into a per-node :class:`app.features.window.NodeWindow`; after each scrape round the
  node's features are aggregated over the node x app window (DWA) and applied, as node-features values,
  to one :class:`app.scheduler.builder.SnapshotBuilder` per app, which builds the scheduler's snapshot;
- a placement is :func:`app.scheduler.decide.decide` - the extender's own predict, filter and score
  (:func:`app.scheduler.scoring.score_nodes` with each node's credibility, assumed pods counted) - and the
  policy takes :meth:`Decision.best`;
- completions feed samples (:mod:`app.sim.policies.learner`) and the 5 s feedback loop
  (:mod:`app.sim.policies.feedback`): credibility becomes node-weights, DWA moves windows, a drift
  detector that fires retrains the model key synchronously, on the samples so far (bounded).

Until an app has ``warmup_per_app`` samples, its tasks go to the least-sampled candidate of the class
the app asks for (GPU nodes for GPU apps), so every GPU model starts from every GPU generation.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from app.contracts.keys import model_key
from app.features.window import NodeWindow
from app.scheduler.assumed import AssumedPods
from app.scheduler.builder import SnapshotBuilder
from app.scheduler.decide import DecideParams, decide
from app.scheduler.filtering import contention_factor
from app.scheduler.podinfo import PodInfo
from app.scheduler.policy import policy_from_dict
from app.scheduler.snapshot import Snapshot
from app.sim.apps import APPS
from app.sim.hardware import NodeSpec
from app.sim.policies.base import BasePolicy
from app.sim.policies.feedback import Feedback
from app.sim.policies.learner import ModelBook
from app.sim.view import ClusterView, Task

log = logging.getLogger(__name__)


class RttAware(BasePolicy):
    """See the module docstring. Options are keyword arguments kept as attributes."""

    name = "rtt_aware"

    def __init__(self, rng: np.random.Generator, *, dwa: bool = True, select: bool = True,
                 warmup_per_app: int = 60, min_train: int = 40, max_samples: int = 1000,
                 error_period_s: float = 5.0, growth_retrain_min_s: float = 20.0, contention_other: float = 0.3,
                 window_s: float = 30.0, train_params: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        if error_period_s <= 0 or warmup_per_app < 0 or min_train < 20:
            raise ValueError("RttAware: need error_period_s > 0, warmup_per_app >= 0, min_train >= 20")
        self.rng = rng
        self.warmup_per_app = warmup_per_app
        self.min_train = min_train
        self.error_period_s = error_period_s
        self.growth_retrain_min_s = growth_retrain_min_s
        self.book = ModelBook(max_samples=max_samples, select=select, seed=int(rng.integers(2**31)),
                              train_params=train_params)
        self.feedback = Feedback(dwa=dwa, window_s=window_s)
        self.params = DecideParams(policy=policy_from_dict({"contention": {"other": contention_other},
                                                            "assumed": {"scrape_delay_s": 1.0}}))
        self.assumed = AssumedPods(ttl_s=120.0, scrape_delay_s=1.0)
        self._windows: dict[str, NodeWindow] = {}
        self._spec: dict[str, NodeSpec] = {}
        self._dirty: set[str] = set()
        self._builders = {app: SnapshotBuilder() for app in APPS}
        self._snap: dict[str, Snapshot] = {}
        self._inflight: dict[int, tuple[Mapping[str, float], float, float]] = {}
        self._per_node_samples: dict[tuple[str, str], int] = {}
        self._app_samples: dict[str, int] = dict.fromkeys(APPS, 0)
        self._next_period: float | None = None
        self.name = self._variant(dwa, select)

    @staticmethod
    def _variant(dwa: bool, select: bool) -> str:
        return "rtt_aware" + ("" if dwa else "_fixed_window") + ("" if select else "_all_features")

    # -- observation
    def observe_metrics(self, node: str, ts: float, metrics: Mapping[str, float], view: ClusterView) -> None:
        w = self._windows.get(node)
        if w is None:
            w = self._windows[node] = NodeWindow(self.feedback.window_s, history_s=120.0)
            self._spec[node] = view.node(node)
        w.update(ts, metrics)
        self._dirty.add(node)

    def tick(self, view: ClusterView) -> None:
        ts = view.ts
        for node in self._dirty:
            spec, w = self._spec[node], self._windows[node]
            for app, builder in self._builders.items():
                agg = w.aggregate(window_s=self.feedback.window(node, app))
                builder.apply_node_features({"node": node, "ts": ts, "node_class": spec.node_class,
                                             "gpu_model": spec.gpu_model, "features": agg.features()})
        self._dirty.clear()
        if self._next_period is None:
            self._next_period = ts + self.error_period_s
        elif ts >= self._next_period:
            self._next_period = ts + self.error_period_s
            self._close_period(view)
        self.assumed.expire(ts)
        self._snap = {app: b.build(ts) for app, b in self._builders.items()}

    def _close_period(self, view: ClusterView) -> None:
        ts, t = view.ts, view.now
        res = self.feedback.close_period(ts)
        for key, mape, _rmse in res.errors:
            self.trace.errors.append((t, key, mape))
        for node, weight in res.weights.items():
            self.trace.weights.append((t, node, weight))
            for b in self._builders.values():
                b.apply_node_weights({"node": node, "ts": ts, "weight": weight, "predicted_rtt_ms": {},
                                      "stale": False})
        for key, window in res.windows.items():
            self.trace.windows.append((t, key, window))
        for key, reason in res.retrain.items():
            self._train(key, t, reason)
        for key, m in list(self.book.models.items()):  # enough new data since the last training: learn from it
            fresh = self.book.added.get(key, 0) - m.n_samples
            if fresh >= max(50, m.n_samples // 2) and t - m.at_s >= self.growth_retrain_min_s:
                self._train(key, t, "growth")

    def _train(self, key: str, t: float, reason: str) -> None:
        app, node_class = key.split(":", 1)
        trained = self.book.train(key, node_class, t, reselect=reason.startswith("drift"))
        if trained is None:
            return
        self._builders[app].set_model(key, trained.version, trained.predictor)
        self.trace.retrains.append((t, key, reason))

    # -- decisions
    def _warmup_choice(self, task: Task, candidates: Sequence[NodeSpec]) -> NodeSpec:
        wants_gpu = task.profile.on_gpu is not None
        pool = [c for c in candidates if c.node_class == "gpu"] if wants_gpu else list(candidates)
        pool = pool or list(candidates)
        return min(pool, key=lambda c: self._per_node_samples.get((c.name, task.app), 0))

    def choose(self, task: Task, candidates: Sequence[NodeSpec], view: ClusterView) -> NodeSpec:
        ts = view.ts
        by_name = {c.name: c for c in candidates}
        chosen: NodeSpec | None = None
        predicted = float("nan")
        snap = self._snap.get(task.app)
        if self._app_samples[task.app] < self.warmup_per_app or snap is None:
            chosen = self._warmup_choice(task, candidates)
        else:
            pod = PodInfo(task.task_id, "sim", task.task_id, task.app, task.input_mb)
            decision = decide(snap, pod, list(by_name), self.assumed, self.params, ts)
            best = decision.best()
            if best is not None:
                chosen = by_name[best]
                predicted = next(v.predicted_rtt_ms for v in decision.verdicts if v.node == best)
            else:  # no prediction for any candidate (e.g. only CPU nodes left, no CPU model yet)
                chosen = min(candidates, key=lambda c: view.running(c.name))
        features: Mapping[str, float] = {}
        factor = 1.0
        if snap is not None and chosen.name in snap.nodes:
            st = snap.nodes[chosen.name]
            features = {**st.features, "task_input_size_mb": task.input_mb}
            pending = self.assumed.pending(chosen.name, st.features_ts, ts, exclude=task.task_id)
            factor = contention_factor(task.app, (p.app for p in pending), self.params.policy)
        self._inflight[task.idx] = (features, predicted, factor)
        if np.isfinite(predicted):
            self.trace.predicted_ms[task.idx] = predicted
        self.assumed.assume(task.task_id, task.app, chosen.name, ts)
        return chosen

    def observe_completion(self, task: Task, node: str, rtt_ms: float, view: ClusterView) -> None:
        features, predicted, factor = self._inflight.pop(task.idx, ({}, float("nan"), 1.0))
        self.assumed.forget(task.task_id)
        spec = view.node(node)
        self._app_samples[task.app] += 1
        k = (node, task.app)
        self._per_node_samples[k] = self._per_node_samples.get(k, 0) + 1
        if np.isfinite(predicted):
            self.feedback.add(node, spec.node_class, task.app, predicted, rtt_ms)
        if not features:
            return
        key = model_key(task.app, spec.node_class)
        # the model learns RTT as the features show the node; pods the metrics did not show yet are the
        # decision's contention factor, so the label leaves them out
        n = self.book.add(key, features, rtt_ms / factor)
        if key not in self.book.models and n >= self.min_train and n % 10 == 0:
            self._train(key, view.now, "initial")
