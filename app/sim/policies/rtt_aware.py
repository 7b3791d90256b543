"""The RTT-aware policy: this project's production pipeline, driven by the simulator's messages.

- every scrape goes into a per-node :class:`app.features.window.NodeWindow`; after each scrape round the
  node's features are aggregated over the node x app window (DWA) and applied, as node-features values,
  to one :class:`app.scheduler.builder.SnapshotBuilder` per app, which builds the scheduler's snapshot;
- the node-features value also carries the scheduler's own view of the pods running on the node, one
  count per app (``running_pods_<app>``: bound pods the scheduler placed and has not seen finish). A
  task's time depends mostly on what runs beside it when it starts, which a 1 s scrape shows late or
  not at all; the count is exact at decision time, and the training sample carries the same value;
- a placement is :func:`app.scheduler.decide.decide` - the extender's own predict, filter and score
  (:func:`app.scheduler.scoring.score_nodes` with each node's credibility) - and the policy takes
  :meth:`Decision.best`. Models predict the *service time*; the task's wait so far (known when it is
  placed) is added to give its RTT. The assumed-pods contention penalty is off by default
  (``contention_other=0``): the running-pod counts already include the pods just placed;
- completions feed samples (:mod:`app.sim.policies.learner`: service time, monotone XGBoost with a log
  link) and the 5 s feedback loop (:mod:`app.sim.policies.feedback`): credibility becomes node-weights,
  DWA moves windows, a drift detector that fires retrains the model key (features re-selected). A key
  also retrains when its samples grew by ``growth`` (50 %) since its last training: early models
  improve quickly, later retrains are rare;
- between retrains a node's predictions (and ranking) for an app carry its residual factor (the model's recent
  log error there, :class:`app.sim.policies.feedback.Residuals`): a throttled node is priced right in a few tasks.

Exploration: each node of the class an app asks for (GPU nodes for a GPU app, any node for ``upload``)
first gets ``warmup_per_node`` of the app's tasks (a node that joins later too); until a model covers
one of them, a task goes to the node with the lowest mean service time per input MB seen so far.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from app.contracts.keys import model_key, parse_model_key
from app.features.window import NodeWindow
from app.scheduler.assumed import AssumedPods
from app.scheduler.builder import SnapshotBuilder
from app.scheduler.decide import DecideParams, Decision, decide
from app.scheduler.podinfo import PodInfo
from app.scheduler.policy import policy_from_dict
from app.scheduler.scoring import score_nodes
from app.scheduler.snapshot import Snapshot
from app.sim.apps import APPS
from app.sim.hardware import NodeSpec
from app.sim.policies.base import BasePolicy
from app.sim.policies.feedback import Feedback, Residuals
from app.sim.policies.learner import RUNNING_PREFIX, ModelBook
from app.sim.view import ClusterView, Task

log = logging.getLogger(__name__)

# a model sees at most ``max_samples`` (1,000) rows: 64 histogram bins already resolve them, and 512 (the
# preset's) cost 4-5x the training time on the simulator's critical path
SIM_TRAIN_PARAMS: dict[str, Any] = {"max_bin": 64}


class RttAware(BasePolicy):
    """See the module docstring. Options are keyword arguments kept as attributes.

    ``dwa=False``: a fixed ``window_s`` feature window; ``select=False``: every metric feature once a key
    has enough rows; ``running=False``: no running-pod counts (the scrape-only variant); ``monotone``:
    the constraints of :func:`app.sim.policies.learner.direction`; ``target``: see
    :class:`~app.sim.policies.learner.ModelBook`; ``node_models``: also train a node's own model
    (``app:class:node``) once it has this many samples (None: class models only); ``drift_threshold``:
    the Page-Hinkley threshold; ``retrain_min_s``: least time between retrains of a key on drift;
    ``correct_alpha``: the residual correction's step (None: off); ``correct_reset``: start it over when the
    app's model is retrained; ``correct_rank``: rank candidates on corrected predictions (else only report them).
    """

    name = "rtt_aware"

    def __init__(self, rng: np.random.Generator, *, dwa: bool = True, select: bool = True, running: bool = True,
                 monotone: bool = True, warmup_per_node: int = 2, min_train: int = 20, growth: float = 0.5,
                 max_samples: int = 1000, target: str = "gamma", error_period_s: float = 5.0,
                 retrain_min_s: float = 10.0, contention_other: float = 0.0, window_s: float = 30.0,
                 drift_threshold: float = 0.5, node_models: int | None = None,
                 train_params: Mapping[str, Any] | None = None, correct_alpha: float | None = 0.2,
                 correct_reset: bool = True, correct_rank: bool = True) -> None:
        super().__init__()
        if error_period_s <= 0 or warmup_per_node < 0 or min_train < 20 or retrain_min_s < 0 or growth <= 0:
            raise ValueError("RttAware: need error_period_s > 0, warmup_per_node >= 0, min_train >= 20, "
                             "retrain_min_s >= 0, growth > 0")
        self.rng = rng
        self.running = running
        self.monotone = monotone
        self.warmup_per_node = warmup_per_node
        self.min_train = min_train
        self.growth = growth
        self.node_models = node_models
        self.error_period_s = error_period_s
        self.retrain_min_s = retrain_min_s
        self.book = ModelBook(max_samples=max_samples, select=select, seed=int(rng.integers(2**31)),
                              train_params={**SIM_TRAIN_PARAMS, **(train_params or {})}, target=target)
        self.feedback = Feedback(dwa=dwa, window_s=window_s, drift_threshold=drift_threshold)
        self.residuals = Residuals(alpha=correct_alpha) if correct_alpha is not None else None
        self.correct_reset = correct_reset
        self.correct_rank = correct_rank
        self.params = DecideParams(policy=policy_from_dict({"contention": {"other": contention_other},
                                                            "assumed": {"scrape_delay_s": 1.0}}))
        self.assumed = AssumedPods(ttl_s=120.0, scrape_delay_s=1.0)
        self._windows: dict[str, NodeWindow] = {}
        self._spec: dict[str, NodeSpec] = {}
        self._scraped: set[str] = set()
        self._builders = {app: SnapshotBuilder() for app in APPS}
        self._base: dict[str, dict[str, dict[str, Any]]] = {app: {} for app in APPS}  # app -> node -> value
        self._pods: dict[str, dict[str, int]] = {}  # node -> app -> running pods
        self._moved: dict[str, set[str]] = {app: set() for app in APPS}  # nodes whose pods changed, per app
        self._snap: dict[str, Snapshot] = {}
        self._inflight: dict[int, tuple[Mapping[str, float], float, float, float]] = {}
        self._placed: dict[tuple[str, str], int] = {}  # (node, app) -> tasks placed
        self._per_mb: dict[tuple[str, str], tuple[float, int]] = {}  # (node, app) -> (mean service ms/MB, n)
        self._next_period: float | None = None
        self.name = ("rtt_aware" + ("" if dwa else "_fixed_window") + ("" if select else "_all_features")
                     + ("" if running else "_scrape_only"))

    # -- the view: scraped features + running pods
    def _value(self, app: str, node: str) -> dict[str, Any]:
        base = self._base[app][node]
        if not self.running:
            return base
        pods = self._pods.get(node, {})
        counts = {f"{RUNNING_PREFIX}{a}": float(pods.get(a, 0)) for a in APPS}
        return {**base, "features": {**base["features"], **counts}}

    def _pods_changed(self, node: str, app: str, delta: int) -> None:
        pods = self._pods.setdefault(node, {})
        pods[app] = pods.get(app, 0) + delta
        if self.running:
            for moved in self._moved.values():
                moved.add(node)

    def _snapshot(self, app: str, ts: float) -> Snapshot | None:
        """The app's snapshot with every node's running pods as of now (rebuilt only when they moved)."""
        moved = self._moved[app]
        if moved:
            builder, base = self._builders[app], self._base[app]
            for node in moved:
                if node in base:
                    builder.apply_node_features(self._value(app, node))
            moved.clear()
            self._snap[app] = builder.build(ts)
        return self._snap.get(app)

    # -- observation
    def observe_metrics(self, node: str, ts: float, metrics: Mapping[str, float], view: ClusterView) -> None:
        w = self._windows.get(node)
        if w is None:
            w = self._windows[node] = NodeWindow(self.feedback.window_s, history_s=120.0)
            self._spec[node] = view.node(node)
        w.update(ts, metrics)
        self._scraped.add(node)

    def tick(self, view: ClusterView) -> None:
        ts = view.ts
        for node in self._scraped:
            spec, w = self._spec[node], self._windows[node]
            for app, builder in self._builders.items():
                agg = w.aggregate(window_s=self.feedback.window(node, app))
                self._base[app][node] = {"node": node, "ts": ts, "node_class": spec.node_class,
                                         "gpu_model": spec.gpu_model, "features": agg.features()}
                builder.apply_node_features(self._value(app, node))
                self._moved[app].discard(node)
        self._scraped.clear()
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
            m = self.book.models.get(key)
            if (m is None and self.book.n_samples(key) >= self.min_train) or (
                    m is not None and t - m.at_s >= self.retrain_min_s):
                self._train(key, t, ts, reason)

    def _train(self, key: str, t: float, ts: float, reason: str) -> None:
        app, node_class, _node = parse_model_key(key)
        gpu_app = APPS[app].on_gpu is not None and node_class == "gpu"
        trained = self.book.train(key, node_class, t, reselect=reason.startswith("drift"),
                                  gpu_app=gpu_app if self.monotone else None)
        if trained is None:
            return
        self._builders[app].set_model(key, trained.version, trained.predictor)
        if self.residuals is not None and self.correct_reset:
            self.residuals.reset(app)
        self._snap[app] = self._builders[app].build(ts)
        self.trace.retrains.append((t, key, reason))

    # -- decisions
    def _explore(self, task: Task, candidates: Sequence[NodeSpec], snap: Snapshot | None) -> NodeSpec | None:
        """A candidate to learn about, or None to exploit the models.

        Among the candidates of the class the app asks for (GPU nodes for a GPU app, any node otherwise):
        the least-placed one while it has had fewer than ``warmup_per_node`` tasks of the app; then, while
        no model covers any of them, the one with the lowest mean service time per input MB seen so far.
        """
        wants_gpu = task.profile.on_gpu is not None
        pool = [c for c in candidates if c.node_class == "gpu"] if wants_gpu else list(candidates)
        pool = pool or list(candidates)
        placed = self._placed
        least = min(pool, key=lambda c: placed.get((c.name, task.app), 0))
        if placed.get((least.name, task.app), 0) < self.warmup_per_node:
            return least
        routes = snap.routes(task.app) if snap is not None else {}
        if any(c.name in routes for c in pool):
            return None
        return min(pool, key=lambda c: self._per_mb.get((c.name, task.app), (math.inf, 0))[0])

    def _best(self, decision: Decision, app: str) -> int | None:
        """Index of the chosen candidate; with residual correction its ``rtt_ms`` is corrected in place.

        Each candidate's prediction is multiplied by its node's residual factor for ``app`` and the scores
        are recomputed (:func:`app.scheduler.scoring.score_nodes`, same credibilities); the top score wins,
        the lowest RTT breaks ties, as in :meth:`Decision.best`.
        """
        if decision.neutral is not None:
            return None
        if self.residuals is not None and self.correct_rank:
            res = self.residuals
            decision.rtt_ms[:] = [r * res.factor(n, app) for n, r in zip(decision.nodes, decision.rtt_ms, strict=True)]
            decision.score[:] = score_nodes(np.asarray(decision.rtt_ms), np.asarray(decision.credibility)).tolist()
        ok = [i for i, f in enumerate(decision.failed) if f is None and math.isfinite(decision.rtt_ms[i])]
        return min(ok, key=lambda i: (-decision.score[i], decision.rtt_ms[i])) if ok else None

    def choose(self, task: Task, candidates: Sequence[NodeSpec], view: ClusterView) -> NodeSpec:
        ts = view.ts
        wait_ms = max(0.0, (view.now - task.submit_s) * 1000.0)
        by_name = {c.name: c for c in candidates}
        predicted = model_ms = float("nan")
        snap = self._snapshot(task.app, ts)
        chosen = self._explore(task, candidates, snap)
        if chosen is None and snap is not None:
            pod = PodInfo(task.task_id, "sim", task.task_id, task.app, task.input_mb)
            decision = decide(snap, pod, list(by_name), self.assumed, self.params, ts)
            best = self._best(decision, task.app)
            if best is not None:
                chosen = by_name[decision.nodes[best]]
                model_ms = decision.model_rtt_ms[best]
                factor = self.residuals.factor(chosen.name, task.app) if self.residuals is not None else 1.0
                predicted = wait_ms + model_ms * factor
        if chosen is None:  # no prediction for any candidate (e.g. only CPU nodes left, no CPU model yet)
            chosen = min(candidates, key=lambda c: view.running(c.name))
        features: Mapping[str, float] = {}
        if snap is not None and chosen.name in snap.nodes:
            features = {**snap.nodes[chosen.name].features, "task_input_size_mb": task.input_mb}
        self._inflight[task.idx] = (features, predicted, wait_ms, model_ms)
        if np.isfinite(predicted):
            self.trace.predicted_ms[task.idx] = predicted
        self.assumed.assume(task.task_id, task.app, chosen.name, ts)
        self._pods_changed(chosen.name, task.app, +1)
        placed = (chosen.name, task.app)
        self._placed[placed] = self._placed.get(placed, 0) + 1
        return chosen

    def observe_completion(self, task: Task, node: str, rtt_ms: float, view: ClusterView) -> None:
        features, predicted, wait_ms, model_ms = self._inflight.pop(task.idx, ({}, float("nan"), 0.0, float("nan")))
        self.assumed.forget(task.task_id)
        self._pods_changed(node, task.app, -1)
        spec = view.node(node)
        k = (node, task.app)
        if np.isfinite(predicted):
            self.feedback.add(node, spec.node_class, task.app, predicted, rtt_ms)
        service_ms = rtt_ms - wait_ms
        if self.residuals is not None:
            self.residuals.update(node, task.app, model_ms, service_ms)
        mean, n = self._per_mb.get(k, (0.0, 0))
        self._per_mb[k] = (mean + (service_ms / max(task.input_mb, 1e-3) - mean) / (n + 1), n + 1)
        if not features:
            return
        self._learn(model_key(task.app, spec.node_class), features, service_ms, self.min_train, view)
        if self.node_models is not None:
            self._learn(model_key(task.app, spec.node_class, node), features, service_ms, self.node_models, view)

    def _learn(self, key: str, features: Mapping[str, float], service_ms: float, min_rows: int,
               view: ClusterView) -> None:
        """Add a sample to ``key``; train it once it has ``min_rows``, retrain when its samples grew enough."""
        n = self.book.add(key, features, service_ms)
        m = self.book.models.get(key)
        if m is None:
            if n >= min_rows and n % 10 == 0:
                self._train(key, view.now, view.ts, "initial")
        elif self.book.added[key] - m.n_samples >= self.growth * min(m.n_samples, self.book.max_samples):
            self._train(key, view.now, view.ts, "growth")
