"""Every error period: prediction-errors per node, DWA windows and drift retrain-events; every quarter of a second
(and a key's first model at its sample): cold-start and growth retrain-events.

The period timer (``settings.error_period_s``) closes the open period of every node this worker holds
(:meth:`~app.drift.tracker.NodeTracker.close`) and stages one prediction-errors message per node that had
pairs in the outbox (:mod:`~app.streams.feedback_outbox`); the checkpoint that follows makes the closed
state and the messages durable together, then sends them and waits for their acknowledgement (a kill at
any moment neither loses nor repeats a pair). A message has an ``apps`` map (``n, rmse_ms, mae_ms, mape,
bias_ms`` of the period, ``cumulative``: the node × app Page-Hinkley statistic over per-period MAPE, ``model_key``).

* DWA: each evaluated app's window is set on the node's state (``NodeState.set_window(s, app)``), so it
  travels in node-features ``windows`` and is persisted with the node's window.
* Drift: when a node × app detector fires, a retrain-event for ``app:node_class`` with reason ``drift``,
  the statistic (``cumulative_error``), ``threshold``, ``ts`` (the period's close) and ``onset_ts``. The
  period resets the detector, so the event is staged in the outbox with the prediction-errors and goes
  out with them once the checkpoint holding the reset is stored; one not acknowledged stays staged for
  the next checkpoint, and a restarted worker looks for it in the topic before it sends it
  (:mod:`~app.streams.feedback_outbox`): no failure loses a drift, and neither a kill nor a lost
  acknowledgement asks it twice.
* Cold start (checked at every sample of a key without a model, as the join counts it, and every
  ``SAMPLE_CHECK_S``, 0.25 s, with the rest): a model key without a model whose samples seen by this worker
  reach ``options.cold_start_samples`` gets a retrain-event with reason ``cold_start`` (``cumulative_error``:
  the sample count, ``threshold``: the option); asked again only once the count has doubled (the
  trainer may still be training, or found too few usable rows). None is asked before the worker's models
  are in use (:meth:`~app.streams.feedback_models.ModelCache.settled`: model-updates read to its end at
  start and the loads that read started resolved, or 30 s passed), so a restart asks none for keys that
  have models. Asked at the sample, a new cluster's first models do not wait up to a quarter of a second
  for the check (docs/feedback.md: measured); an ask that fails there (Kafka away) is asked again by the
  check.
* Growth (checked with the cold start): a key with a model whose samples grew by
  ``options.retrain_growth`` (50 %) since the last retrain asked gets a retrain-event with reason
  ``growth`` (:mod:`app.drift.growth`).

Drift retrain events are debounced: at most one per model key per ``settings.retrain_debounce_s`` per
worker (:class:`~app.drift.growth.Debounce`; cold-start and growth asks are spaced by their own rule). The
interval starts when the event is staged: it is in the outbox from then on, sent again until acknowledged.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable
from typing import Any

import faust
import orjson
from aiokafka.errors import KafkaError

from app.contracts import encode
from app.contracts.keys import model_key
from app.drift.errorstats import ErrorStats
from app.drift.growth import Debounce, SampleGrowth, sample_check_s
from app.drift.tracker import AppReport
from app.errors import ContractError
from app.streams.feedback_outbox import ErrorsOutbox
from app.streams.feedback_state import FeedbackLoop
from app.streams.timers import timer
from app.streams.topics import await_delivery, contract_topic

log = logging.getLogger(__name__)


def errors_value(node: str, node_class: str | None, ts: float, period_s: float,
                 reports: dict[str, AppReport]) -> dict[str, Any]:
    """The prediction-errors value of one node's closed period."""
    apps = {}
    for app, r in reports.items():
        entry = {**r.stats, "cumulative": round(r.cumulative, 6)}
        if node_class:
            entry["model_key"] = model_key(app, node_class)
        apps[app] = entry
    value: dict[str, Any] = {"node": node, "ts": ts, "period_s": period_s, "apps": apps}
    if node_class:
        value["node_class"] = node_class
    return value


def register_errors(app: faust.App, loop: FeedbackLoop) -> None:
    """Add the error-period timer to ``app``."""
    settings, clock = loop.settings, loop.clock
    errors_topic = contract_topic(app, settings, "prediction-errors")
    retrain_topic = contract_topic(app, settings, "retrain-events")
    debounce = Debounce(settings.retrain_debounce_s)
    period = settings.error_period_s
    fm, retrain_out = loop.metrics.feedback, loop.metrics.messages_out.labels("retrain-events")

    async def retrain(key: str, reason: str, cumulative: float, threshold: float, onset: float | None) -> bool:
        if not debounce.allow(key, clock.monotonic(), reason):
            fm.retrain_debounced.labels(reason).inc()
            return False
        value = {"model_key": key, "reason": reason, "cumulative_error": float(cumulative),
                 "threshold": float(threshold), "ts": clock.now(), "onset_ts": onset}
        try:  # counted once the trainer can read it (a cold start or growth ask not stored is asked again)
            raw = encode("retrain-events", value)
        except ContractError as exc:  # figures past the contract's bounds: said, not raised into the period
            log.error("retrain-event %s (%s) not sent: %s", key, reason, exc)
            return False
        try:
            await await_delivery(await retrain_topic.send(key=key.encode(), value=raw))
        except KafkaError as exc:
            log.warning("retrain-event %s (%s) not stored: %r", key, reason, exc)
            return False
        fm.retrain_events.labels(reason).inc()
        retrain_out.inc()
        log.info("retrain-event %s (%s): cumulative %.3f > %.3f", key, reason, cumulative, threshold)
        return True

    outbox = loop.outbox = ErrorsOutbox(settings, lambda key, value: errors_topic.send(key=key, value=value),
                                        metrics=loop.metrics, clock=clock,
                                        send_retrain=lambda key, value: retrain_topic.send(key=key, value=value))

    def stage_drift(partition: int, node: str, key: str, r: AppReport, now: float) -> None:
        """Stage the retrain-event of a drift ``node``'s detector signalled, unless the key's debounce holds it."""
        value = {"model_key": key, "reason": "drift", "cumulative_error": float(r.cumulative),
                 "threshold": float(r.threshold), "ts": now, "onset_ts": r.onset_ts}
        try:
            raw = encode("retrain-events", value)
        except ContractError as exc:  # figures past the contract's bounds: said, not raised into the period
            log.error("retrain-event %s (drift) not sent: %s", key, exc)
            return
        if not debounce.allow(key, clock.monotonic(), "drift"):
            fm.retrain_debounced.labels("drift").inc()
            return
        outbox.stage_retrain(partition, node, orjson.loads(raw))

    async def close_period() -> int:
        due = [n for n, t in loop.trackers.items() if n in loop.partitions and t.pending()]
        await outbox.prepare({loop.partitions[n] for n in due})
        now = clock.now()
        closed: dict[str, dict[str, AppReport]] = {}
        by_class: dict[tuple[str, str], ErrorStats] = collections.defaultdict(ErrorStats)
        states = loop.nodes.store.states
        for node, tracker in list(loop.trackers.items()):  # from here to the checkpoint: no await
            if node not in loop.partitions or not tracker.pending():
                continue
            reports = tracker.close(now)
            if not reports:
                continue
            closed[node] = reports
            loop.dirty_nodes.add(node)
            node_class = loop.node_class.get(node) or (states[node].node_class if node in states else None)
            state = states.get(node)
            for app_name, r in reports.items():
                if state is not None and state.windows.get(app_name) != r.window_s:
                    state.set_window(r.window_s, app_name)
                if node_class:
                    by_class[(app_name, node_class)] = by_class[(app_name, node_class)] + r.errors
                    if r.drift:
                        stage_drift(loop.partitions[node], node, model_key(app_name, node_class), r, now)
            outbox.stage(loop.partitions[node], errors_value(node, node_class, now, period, reports))
        # the closed trackers (their reset detectors) and their messages become durable together, then the
        # messages are sent; what is not stored or not acknowledged now goes out with a later checkpoint
        await loop.checkpoint()
        for (app_name, node_class), stats in by_class.items():
            fm.prediction_rmse.labels(app_name, node_class).set(stats.rmse_ms)
            fm.prediction_mape.labels(app_name, node_class).set(stats.mape)
        return len(closed)

    growth = SampleGrowth(loop.options.cold_start_samples, loop.options.retrain_growth)
    asking: set[str] = set()  # keys whose ask is being sent (the timer and a sample may meet)

    async def cold_start(keys: Iterable[str] | None = None) -> None:
        for key in list(loop.samples_per_key if keys is None else keys):
            if key in asking:
                continue
            count = loop.samples_per_key[key]
            has_model = loop.models.has(key)
            if not has_model and not loop.models.settled():  # the models announced may not be loaded yet
                continue
            reason = growth.due(key, count, has_model=has_model)
            if reason is None:
                continue
            threshold = growth.threshold(key, has_model=has_model)
            asking.add(key)
            try:
                if await retrain(key, reason, float(count), threshold, None):
                    growth.asked(key, count)
            finally:
                asking.discard(key)

    spawned: set[str] = set()  # keys with an ask started at a sample and not yet done

    async def ask_first_model(key: str) -> None:
        try:
            await cold_start((key,))
        except Exception as e:  # the next sample check asks again
            log.warning("cold start of %s not asked at its sample (%s); the sample check asks again", key, e)
        finally:
            spawned.discard(key)

    def sample_counted(key: str) -> None:
        """A sample of ``key`` was counted: a key without a model asks its cold start at once when its count
        calls for it (the first models of a new cluster, every quarter of a second sooner), not at the next
        sample check; growth retrains wait for the check."""
        if key in spawned or key in asking or loop.models.has(key) or not loop.models.settled():
            return
        if growth.due(key, loop.samples_per_key[key], has_model=False) is None:
            return
        spawned.add(key)  # the samples after it in this batch need not start another
        loop.spawn(ask_first_model(key), f"cold-start {key}")

    @timer(app, period, "feedback-errors")
    async def error_period() -> None:
        await close_period()

    @timer(app, sample_check_s(period), "feedback-samples")
    async def sample_check() -> None:
        await cold_start()

    def forget_apps(apps: set[str]) -> None:
        def retired(key: str) -> bool:
            return key.partition(":")[0] in apps

        growth.forget(retired)
        debounce.forget(retired)

    loop.on_forget_apps.append(forget_apps)
    loop.handles["close_period"] = close_period
    loop.handles["cold_start"] = cold_start
    loop.handles["sample_counted"] = sample_counted
