"""The RTT-aware policy: the production learning path, driven in process by the simulator's messages.

Nothing here predicts, learns or decides by a rule of its own; each step calls what the live processes run:

- **node-features** (worker): every scrape goes into the node's :class:`~app.features.window.NodeWindow`;
  each scrape round, :func:`app.features.node_value.features_value` (the node's window, and over each
  modelled app's DWA window the features its models read) goes to the scheduler's
  :class:`~app.scheduler.builder.SnapshotBuilder`; a podwatch-like running view of the pods per app on
  each node every ``running_refresh_s`` (:meth:`SnapshotBuilder.apply_running`; 0: at every start and end;
  None, the default: none, as in the demo);
- **placement** (extender): :func:`app.scheduler.cycle.schedule` with the deployed extender policy
  (:func:`shipped_policy`, which the demo runs too; ``policy`` overrides its fields): the extender's filter
  and prioritize (:func:`app.scheduler.decide.decide`: models, residual correction, credibility, assumed
  pods, exploration) in kube-scheduler's order — no node left: the pod stays pending; one: bound without prioritize and
  assumed there; several: the winner of prioritize over them (:meth:`Decision.best`) — assumed as the
  extender assumes it and forgotten when its completion arrives (the extender reads task-completions,
  :mod:`app.extender.feed`); when there is no winner, the top-scored candidates go to Kubernetes' default
  scoring, as kube-scheduler (and the live :class:`~app.sim.policies.extender_http.ExtenderPolicy`) would;
- **feedback** (worker): each completion is one pair of the join (``NodeTracker.add``: errors and the
  residual, from the model's own prediction) and one training sample (:func:`app.features.node_value.sample_value`
  into the trainer's :class:`~app.trainer.history.SampleHistory`); every error period
  ``NodeTracker.close`` (DWA, Page-Hinkley with drift episodes, credibility) gives node-weights for every
  node with metrics (``NodeTracker.weights_fields``, the prior for a node without completions yet, ``stale``
  as the worker marks it; no ``predicted_rtt_ms``: the extender holds every model the worker would predict
  it with) and drift retrains with their onset, and every ``SAMPLE_CHECK_S``
  :class:`~app.drift.growth.SampleGrowth` asks cold-start and growth retrains, each debounced per key;
- **retrains** (trainer): :class:`~app.sim.policies.training.SimulatedTrainer` runs
  :func:`app.trainer.pipeline.retrain` off the decision path, with the trainer's seed and
  ``Settings.trainer_margin``; a promoted model serves from its verdict
  on (the first placement or scrape round at or after it: the extender takes a model-updates message when it
  arrives, not at a scrape round), and the residuals and drift detectors of its app on its class's nodes start afresh.

Settings are the production defaults (:class:`app.config.Settings`); keyword arguments override them.
The candidates are the nodes the cluster's filter passes (a pod requesting ``nvidia.com/gpu`` is offered
the nodes with a GPU share free, as kube-scheduler's resource filter does).
"""

from __future__ import annotations

import collections
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from app.config import Settings
from app.contracts.completions import service_ms
from app.contracts.keys import model_key, parse_model_key
from app.drift.growth import Debounce, SampleGrowth, sample_check_s
from app.drift.residual import model_prediction
from app.drift.tracker import NodeTracker
from app.features.node_value import features_value, sample_value
from app.features.window import NodeWindow
from app.model.fast import FastPredictor
from app.scheduler.assumed import AssumedPods
from app.scheduler.builder import SnapshotBuilder
from app.scheduler.cycle import schedule
from app.scheduler.decide import DecideParams, Decision
from app.scheduler.podinfo import PodInfo
from app.scheduler.policy import load_policy_document, policy_from_dict
from app.scheduler.snapshot import Snapshot
from app.sim.hardware import NodeSpec
from app.sim.policies.base import BasePolicy
from app.sim.policies.kube_default import KubeDefault
from app.sim.policies.training import Champion, SimulatedTrainer, VerdictDelay
from app.sim.view import ClusterView, Task
from app.trainer.history import SampleHistory
from app.trainer.pipeline import default_selector

SHIPPED_POLICY = Path(__file__).resolve().parents[3] / "deploy" / "extender" / "policy.yaml"
NAMED_LISTS = 8  # candidate lists whose names RttAware.choose remembers


@functools.cache
def shipped_policy() -> Mapping[str, Any]:
    """The extender's policy as deployed (``deploy/extender/policy.yaml``, the same as k8s/config.yaml's), which
    the simulated extender and the demo's run: its SLAs and anti-affinity pairs (none by default), and each pod
    not yet in the metrics adding 50 % (an interfering app) or 30 % (any other) to its node's predicted RTT for a
    scrape interval (docs/simulator.md measured 0, 0.1, 0.3, 0.5: a model trained on a few dozen tasks has rarely seen
    more than one or two pods beside a task and prices the third like the second)."""
    return MappingProxyType(load_policy_document(SHIPPED_POLICY))


SIM_TRAIN_PARAMS: dict[str, Any] = {"nthread": 1}  # one background thread: reproducible on any machine


class RttAware(BasePolicy):
    """See the module docstring. Options are keyword arguments kept as attributes.

    ``dwa=False``: the feature window stays ``Settings.feature_window_s`` (DWA bounds pinned to it);
    ``select=False``: no feature selection (every varying column); ``correction=False``: node-weights carry
    no residual correction; ``explore_share``: the exploration share (0: off); ``running_refresh_s``: the
    running view's period (None: none); ``train_params``: preset overrides; ``train_delay_s``: a fixed
    simulated delay of a retrain's verdict (None: :class:`~app.sim.policies.training.VerdictDelay`'s, by the
    key's rows); ``train_options``: other arguments of :func:`app.trainer.pipeline.retrain`; ``settings``: the
    production settings (defaults when None); ``policy``: fields of the extender's policy document over
    :func:`shipped_policy` (e.g. ``{"objective": {"inflicted": 0}}``).
    """

    name = "rtt_aware"

    def __init__(self, rng: np.random.Generator, *, dwa: bool = True, select: bool = True, correction: bool = True,
                 explore_share: float | None = None, running_refresh_s: float | None = None,
                 train_params: Mapping[str, Any] | None = None, train_delay_s: float | None = None,
                 train_options: Mapping[str, Any] | None = None, settings: Settings | None = None,
                 background: bool = True, policy: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        s = self.settings = settings or Settings()
        if running_refresh_s is not None and not running_refresh_s >= 0:
            raise ValueError(f"RttAware: running_refresh_s must be >= 0 or None (got {running_refresh_s})")
        self.dwa, self.correction, self.running_refresh_s = dwa, correction, running_refresh_s
        explore = {} if explore_share is None else {"share": explore_share}
        doc = {**shipped_policy(), "exploration": explore, **(policy or {})}
        self.params = DecideParams(policy_from_dict(doc), s.credibility_prior, s.extender_stale_after_s)
        chosen = self.params.policy
        self.assumed = AssumedPods(chosen.assumed_ttl_s, chosen.scrape_delay_s)
        self.builder = SnapshotBuilder()
        self.snap: Snapshot | None = None
        self.history = SampleHistory(s.trainer_max_samples_per_key)
        self.growth = SampleGrowth(s.cold_start_samples, s.retrain_growth)
        self.debounce = Debounce(s.retrain_debounce_s)
        self.trainer = SimulatedTrainer(
            delay_s=VerdictDelay() if train_delay_s is None else train_delay_s,
            params={**SIM_TRAIN_PARAMS, **(train_params or {})},
            selector=default_selector if select else None, background=background,
            options={"margin": s.trainer_margin, **(train_options or {})}, gpu_apps=s.gpu_apps)
        self.kube = KubeDefault(rng)
        self.windows: dict[str, NodeWindow] = {}
        self.trackers: dict[str, NodeTracker] = {}
        self.specs: dict[str, NodeSpec] = {}
        self.models: dict[str, tuple[int, Champion]] = {}  # model key -> (version, the model) serving
        self.samples_per_key: collections.Counter[str] = collections.Counter()
        self.pods: dict[str, collections.Counter[str]] = {}  # node -> app -> running (the podwatch's truth)
        self._scraped: set[str] = set()
        self._newest: dict[str, float] = {}  # node -> its newest scrape's time
        self._changes = 0  # placements and completions so far
        self._refused: set[tuple[Any, ...]] = set()  # pods the filter left no node (app, nodes, input) ...
        self._refused_in: tuple[float, int, int] | None = None  # ... in this state (time, snapshot, changes)
        self._named: list[tuple[Sequence[NodeSpec], dict[str, NodeSpec], tuple[str, ...]]] = []  # newest last
        self._input_free = chosen.sla_when_all_fail == "pass" or not chosen.sla_ms
        self._inflight: dict[int, tuple[float, float, dict[str, Any] | None]] = {}  # idx -> (wait ms, start, pred)
        self._explored: set[int] = set()
        # called with (task, decision, chosen node, view) after each placement (bench/bench_regret.py)
        self.on_decision: Callable[[Task, Decision, NodeSpec, ClusterView], None] | None = None
        self._next_period: float | None = None
        self._next_samples: float | None = None
        self._next_running: float | None = None
        self.name = "rtt_aware" + ("" if dwa else "_fixed_window") + ("" if select else "_all_features")

    # -- the worker's side: windows, trackers, node-features, node-weights
    def _tracker(self, node: str) -> NodeTracker:
        t = self.trackers.get(node)
        if t is None:
            s = self.settings
            lo, hi = (s.dwa_min_window_s, s.dwa_max_window_s) if self.dwa else (s.feature_window_s, s.feature_window_s)
            t = self.trackers[node] = NodeTracker.configured(
                window_s=s.feature_window_s, min_window_s=lo, max_window_s=hi, prior=s.credibility_prior,
                drift_delta=s.drift_delta, drift_threshold=s.drift_threshold,
                drift_min_instances=s.drift_min_instances, drift_jump=s.drift_jump)
        return t

    def _app_names(self) -> dict[str, frozenset[str]]:
        names: dict[str, set[str]] = {}
        for key, (_, champion) in self.models.items():
            names.setdefault(parse_model_key(key)[0], set()).update(champion.predictor.feature_names)
        return {app: frozenset(n) for app, n in names.items()}

    def observe_metrics(self, node: str, ts: float, metrics: Mapping[str, float], view: ClusterView) -> None:
        w = self.windows.get(node)
        if w is None:
            s = self.settings
            w = self.windows[node] = NodeWindow(s.feature_window_s, history_s=s.feature_history_s,
                                                bucket_s=s.feature_bucket_s, max_metrics=s.feature_max_metrics)
            self.specs[node] = view.node(node)
        w.update(ts, metrics)
        self._newest[node] = max(ts, self._newest.get(node, ts))
        self._scraped.add(node)

    def tick(self, view: ClusterView) -> None:
        ts = view.ts
        app_names = self._app_names()
        for node in self._scraped:
            spec, t = self.specs[node], self._tracker(node)
            self.builder.apply_node_features(features_value(node, ts, spec.node_class, spec.gpu_model,
                                                            self.windows[node], t.windows(), app_names))
        self._scraped.clear()
        if self.running_refresh_s and (self._next_running is None or ts >= self._next_running):
            self._next_running = ts + self.running_refresh_s
            for node in self.windows:
                self.builder.apply_running(node, self.pods.get(node, {}), ts)
        if self._next_period is None:
            self._next_period = ts + self.settings.error_period_s
        elif ts >= self._next_period:
            self._next_period = ts + self.settings.error_period_s
            self._close_period(view)
        self._sample_timer(view, ts)
        self._models_due(view)
        self.trace.notes["retrain_wait_s"] = self.trainer.waited_s  # wall time, not simulated: not reproducible
        self.trace.notes["retrain_s"] = self.trainer.trained_s  # likewise
        self.assumed.expire(ts)
        self.snap = self.builder.build(ts)

    def _close_period(self, view: ClusterView) -> None:
        ts, t = view.ts, view.now
        for node, tracker in self.trackers.items():
            if not tracker.pending():
                continue
            node_class = self.specs[node].node_class
            for app, r in tracker.close(ts).items():
                self.trace.errors.append((t, f"{node}:{app}", float(r.stats["mape"])))
                self.trace.windows.append((t, f"{node}:{app}", r.window_s))
                if r.drift:
                    self._ask(model_key(app, node_class), "drift", view, r.onset_ts)
        s = self.settings
        stale_after = s.stale_after_scrapes * s.scrape_interval_s
        for node, newest in self._newest.items():  # every node with metrics, as the worker's weights_values
            kept = self.trackers.get(node)
            fields = kept.weights_fields() if kept is not None else {"weight": s.credibility_prior}
            if not self.correction:
                fields.pop("correction", None)
            self.builder.apply_node_weights({"node": node, "ts": ts, **fields, "predicted_rtt_ms": {},
                                             "stale": ts - newest > stale_after})
            self.trace.weights.append((t, node, float(fields["weight"])))

    def _sample_timer(self, view: ClusterView, ts: float) -> None:
        """The worker's sample-check timer, every ``SAMPLE_CHECK_S``: checked at every scrape round and
        completion, it fires at the first one at or after each tick."""
        if self._next_samples is None or ts >= self._next_samples:
            self._next_samples = ts + sample_check_s(self.settings.error_period_s)
            self._check_samples(view)

    def _check_samples(self, view: ClusterView, keys: Sequence[str] | None = None) -> None:
        """Cold-start and growth retrains (the worker's sample check; ``keys``: only those)."""
        for key in list(self.samples_per_key if keys is None else keys):
            count = self.samples_per_key[key]
            has_model = key in self.models
            reason = self.growth.due(key, count, has_model=has_model)
            if reason is not None and self._ask(key, reason, view, None):
                self.growth.asked(key, count)

    # -- the trainer's side
    def _ask(self, key: str, reason: str, view: ClusterView, onset_ts: float | None) -> bool:
        """A retrain-event (drift debounced per key, as the worker sends them); True when sent."""
        if not self.debounce.allow(key, view.now, reason):
            return False
        current = self.models.get(key)
        self.trainer.submit(key, reason, view.now, self.history.dataset(key), current[1] if current else None, onset_ts)
        return True

    def _models_due(self, view: ClusterView) -> bool:
        """Install the retrains whose verdict is due (a model-updates message is taken when it arrives);
        True when any was due."""
        if self.trainer.due_s > view.now:
            return False
        for done in self.trainer.ready(view.now):
            self._install(done, view)
        return True

    def _install(self, done: Any, view: ClusterView) -> None:
        self.trace.retrains.append((view.now, done.key, done.reason))
        if done.verdict is None or not done.verdict.promote:
            return
        version = self.models[done.key][0] + 1 if done.key in self.models else 1
        predictor = FastPredictor.from_booster(done.challenger.result.booster)
        self.models[done.key] = (version, Champion(predictor, done.challenger.fit_window[1]))
        self.builder.set_model(done.key, version, predictor)
        app, node_class, _ = parse_model_key(done.key)
        for node, tracker in self.trackers.items():
            if self.specs[node].node_class == node_class:
                tracker.new_model(app)
        self.trace.notes["promotions"] = self.trace.notes.get("promotions", 0) + 1

    # -- the extender's side
    def choose(self, task: Task, candidates: Sequence[NodeSpec], view: ClusterView) -> NodeSpec | None:
        ts = view.ts
        if self._models_due(view) or (self.builder.dirty and self.running_refresh_s == 0):
            self.snap = self.builder.build(ts)
        by_name, names = self._by_name(candidates)
        # a pod the filter left no node is tried again at each completion, with every other such pod: one asking
        # what was refused while nothing changed (no placement or completion, the same snapshot and time) gets
        # the same answer; with the SLA passing every node when it would fail them all, only anti-affinity
        # fails them all, whatever the pod's input
        state = (view.now, id(self.snap), self._changes)
        if state != self._refused_in:
            self._refused_in, self._refused = state, set()
        asked = (task.app, names, None if self._input_free else task.input_mb)
        if asked in self._refused:
            return None
        pod = PodInfo(task.task_id, "sim", task.task_id, task.app, task.input_mb)
        cycle = schedule(self.snap, pod, names, self.assumed, self.params, ts)
        d = cycle.decision
        if d is None:  # the extender's filter left no node: the pod stays pending
            self._refused.add(asked)
            return None
        self._changes += 1
        if cycle.node is not None:
            chosen = by_name[cycle.node]
        else:  # kube-scheduler places it by its own scores among the top-scored
            chosen = self.kube.choose(task, [by_name[h] for h in cycle.top], view)
        prediction: dict[str, Any] | None = None
        if d.neutral is None:  # what rtt-predictions carries for the node the pod went to
            v = d.verdict(d.nodes.index(chosen.name))
            if not v.stale:
                rtt = v.predicted_rtt_ms if math.isfinite(v.predicted_rtt_ms) else None
                prediction = {"predicted_rtt_ms": rtt, "model_version": v.model_version, "model_key": v.model_key,
                              "features": dict(v.features), "correction": v.correction}
        wait_ms = max(0.0, (view.now - task.submit_s) * 1000.0)
        if prediction is not None and prediction["predicted_rtt_ms"] is not None:
            self.trace.predicted_ms[task.idx] = wait_ms + prediction["predicted_rtt_ms"]
        self._inflight[task.idx] = (wait_ms, ts, prediction)
        if d.explored is not None:  # what exploration costs: its placements and their time (trace notes)
            self._explored.add(task.idx)
        self._pods_changed(chosen.name, task.app, +1, ts)
        if self.on_decision is not None:
            self.on_decision(task, d, chosen, view)
        return chosen

    def _by_name(self, candidates: Sequence[NodeSpec]) -> tuple[dict[str, NodeSpec], tuple[str, ...]]:
        """The candidates by name, and their names in order: remembered for the last few lists (the filter gives
        the same list again until a node fills up, frees room, joins or leaves)."""
        for k in range(len(self._named) - 1, -1, -1):
            seen, by_name, names = self._named[k]
            if seen == candidates:
                return by_name, names
        by_name = {c.name: c for c in candidates}
        names = tuple(by_name)
        if len(self._named) >= NAMED_LISTS:
            del self._named[0]
        self._named.append((list(candidates), by_name, names))
        return by_name, names

    def _pods_changed(self, node: str, app: str, delta: int, ts: float) -> None:
        pods = self.pods.setdefault(node, collections.Counter())
        pods[app] += delta
        if self.running_refresh_s == 0:  # a watch: the view follows every start and end
            self.builder.apply_running(node, pods, ts)

    # -- the worker's join
    def observe_completion(self, task: Task, node: str, rtt_ms: float, view: ClusterView) -> None:
        wait_ms, started_ts, prediction = self._inflight.pop(task.idx)
        ts = view.ts
        self._changes += 1
        self.assumed.forget(task.task_id)
        self._pods_changed(node, task.app, -1, ts)
        spec = self.specs.get(node)
        if spec is None:  # a node that joined and ran a task before its first scrape: its tracker needs its class
            spec = self.specs[node] = view.node(node)
        completion = {"task_id": task.task_id, "app": task.app, "node": node, "submitted_ts": ts - rtt_ms / 1000.0,
                      "started_ts": started_ts, "finished_ts": ts, "rtt_ms": rtt_ms, "status": "ok",
                      "input_size_mb": task.input_mb}
        tracker = self._tracker(node)
        if task.idx in self._explored:
            self._explored.discard(task.idx)
            notes = self.trace.notes
            notes["explored"] = notes.get("explored", 0) + 1
            notes["explored_service_ms"] = notes.get("explored_service_ms", 0.0) + service_ms(completion)
        if prediction is not None and prediction["predicted_rtt_ms"] is not None:
            predicted = prediction["predicted_rtt_ms"]
            key, version = prediction["model_key"], prediction["model_version"]
            serving = key not in self.models or version is None or version >= self.models[key][0]
            tracker.add(task.app, predicted, service_ms(completion),
                        model_ms=model_prediction(predicted, prediction["correction"]), residual=serving)
        tracker.count_sample(task.app)
        value = sample_value(completion, spec.node_class, self.windows.get(node), spec.gpu_model,
                             tracker.window(task.app), prediction)
        self.history.add(value)
        key = value["model_key"]
        self.samples_per_key[key] += 1
        self._sample_timer(view, ts)
        if key not in self.models:  # the worker asks a key's first model at the sample that calls for it
            self._check_samples(view, (key,))
