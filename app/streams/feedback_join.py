"""task-completions ⨝ rtt-predictions on (task_id, node), and every completion as a training sample.

Both topics are keyed by node with node-metrics' partition count, so a worker sees a node's completions,
its predictions and its metrics together; a :class:`~app.streams.intake.PartitionIntake` reads both
topics' partitions that the worker owns, in batches. Each side goes into the
:class:`~app.drift.joinbuffer.JoinBuffer`; a match adds the pair (predicted, observed RTT)
to the node × app errors of the open period. A redelivered message is a duplicate and does nothing. A
prediction marked ``chosen`` (for the node the extender expects the pod on) leaves a full buffer only after
every waiting prediction not so marked (:class:`~app.drift.joinbuffer.JoinBuffer`).

Every new ``ok`` completion becomes a training sample, with its task's prediction for the node when one arrived: the
node's features over the node × app DWA window *before the task started* (event time, from the node's
window history: ``NodeWindow.aggregate(until_ts=started_ts, window_s=...)``), its class and GPU model (the
trainer adds the hardware descriptors from them), ``input_size_mb`` and the observed RTT, keyed by
model key ``app:node_class``. A completion whose node's class is unknown (its metrics not read yet by
the other intake, no prediction naming a model key) is held with its join entry, checkpointed with it, and
makes its sample once either comes; one still held when the entry expires makes no sample, counted in
``rtt_worker_training_samples_dropped_total{reason="unknown_node"}``.

An ``ok`` completion read before its prediction (the extender publishes it only tens of milliseconds before the task
ends, so a slower prediction path or the order of one fetch puts it behind) is held the same way, for at most
``RTT_JOIN_PREDICTION_WAIT_S`` (wall-clock deadline in the held value, so a restored entry keeps it): the prediction
makes its sample at once, with it; at the deadline (looked at every 0.5 s) the sample goes out without it, counted in
``rtt_worker_training_samples_without_prediction_total``, and a prediction arriving after that is a pair and no
second sample. One whose join entry leaves first (``RTT_JOIN_MAX_ENTRIES`` evicts it, or ``RTT_JOIN_TTL_S`` expires
a restored one after a long outage before the timer looks at it) makes its sample without the prediction as it leaves,
never counted as ``unknown_node`` while its node's class is known. Either way the held value is let go in the same
step that makes the sample, so one sample is made per completion (per checkpointed state: a restart before the
checkpoint that stores the release makes it again, as any sample, at least once).
``rtt_worker_training_samples_held`` counts the completions waiting for their node's class only.

A sample goes out on the intake's :class:`~app.kafka.batches.BatchSender`: one the broker does not take is
sent again until it does (at least once: the trainer keeps one row per task and node), the join's read
positions are recorded only once every sample made so far is acknowledged (the checkpoint's flush), and
``rtt_worker_training_samples_total`` counts a sample when it is acknowledged.

A sample is checked against the training-samples contract before it goes out
(:class:`~app.streams.sample_check.SampleCheck`): one a consumer would refuse (a feature name outside the contract's
rule, say, from a metric name an exporter gave) is never sent. Its dead letter (source training-samples, the
partition it was meant for, offset -1, the contract's reason and error, the sample's bytes, the model key) goes out
on the same sender (:meth:`~app.streams.intake.PartitionIntake.refuse`), counted in
``rtt_worker_dead_letters_total{topic="training-samples"}`` once the broker has it; the completion is counted at once
in ``rtt_worker_training_samples_dropped_total{reason="contract"}``, and not in the samples of its model key.

When the matched prediction carries ``features`` (task features the extender computed at decision time:
``running_pods_<app>``), they join the sample's ``features``, so a model is trained on the values it is
asked with; a completion whose prediction has not arrived gets none (missing, NaN, to the trainer).

The observed figure, in the pair and as the sample's ``rtt_ms``, is the task's time on its node
(:func:`app.contracts.completions.service_ms`: ``finished_ts - started_ts``). A pair also moves the node ×
app residual correction, from the model's own prediction (the published one divided by its
``correction``), unless the prediction came from a model version older than the one now serving; every
``ok`` completion counts as one sample of its app on its node (node-weights ``samples``).
"""

from __future__ import annotations

from typing import Any

import faust

from app.contracts import contract, encode
from app.contracts.completions import service_ms
from app.contracts.keys import parse_model_key
from app.drift.joinbuffer import DUPLICATE, MATCHED
from app.drift.residual import model_prediction
from app.errors import ContractError
from app.features.node_value import sample_value as node_sample_value
from app.kafka.batches import partition_for
from app.streams.context import context_of
from app.streams.deadletter import Unsent
from app.streams.feedback_state import FeedbackLoop
from app.streams.intake import PartitionIntake
from app.streams.node_state import NodeState
from app.streams.sample_check import SampleCheck
from app.streams.timers import timer

HELD_RETRY_S = 0.5  # how often held completions look again for their node's class (and their prediction's deadline)
UNTIL = "until"  # in a held value: the wall-clock deadline of a completion waiting for its prediction


def _completion_payload(c: dict[str, Any]) -> dict[str, Any]:
    return {"app": c["app"], "rtt_ms": service_ms(c), "status": c["status"]}


def _prediction_payload(p: dict[str, Any]) -> dict[str, Any]:
    out = {"app": p["app"], "predicted_rtt_ms": p["predicted_rtt_ms"], "model_version": p["model_version"],
           "model_key": p.get("model_key")}
    if p.get("features"):
        out["features"] = p["features"]
    if p.get("correction") is not None:
        out["correction"] = p["correction"]
    return out


def serving(loop: FeedbackLoop, prediction: dict[str, Any]) -> bool:
    """Whether the prediction's model is not older than the version of its key serving now."""
    key, version = prediction.get("model_key"), prediction.get("model_version")
    current = loop.models.version(key) if key else None
    return current is None or version is None or int(version) >= current


def class_of(state: NodeState | None, prediction: dict[str, Any] | None) -> str | None:
    """The node's class from its metrics, else from the model key its prediction was made with."""
    if state is not None and state.newest_ts > 0:
        return state.node_class
    key = (prediction or {}).get("model_key")
    if key:
        try:
            return parse_model_key(key)[1]
        except ContractError:
            return None
    return None


def sample_value(completion: dict[str, Any], node_class: str, state: NodeState | None, window_s: float,
                 prediction: dict[str, Any] | None = None) -> dict[str, Any]:
    """The training-samples value of one completion (:func:`app.features.node_value.sample_value`)."""
    if state is None or state.newest_ts <= 0:
        return node_sample_value(completion, node_class, None, None, window_s, prediction)
    return node_sample_value(completion, node_class, state.window, state.gpu_model, window_s, prediction)


def register_join(app: faust.App, loop: FeedbackLoop) -> PartitionIntake:
    """Create the join's :class:`~app.streams.intake.PartitionIntake` on ``app`` (run as an app task)."""
    settings = loop.settings
    ctx = context_of(app)
    clock, bounds = ctx.clock, ctx.bounds
    samples_name = settings.topic("training-samples")
    samples_partitions = contract("training-samples").partitions
    buffer, store, get_row = loop.buffer, loop.nodes.store, loop.nodes.table.data.get
    fm = loop.metrics.feedback
    matched, duplicate = fm.join.labels(MATCHED), fm.join.labels(DUPLICATE)
    dropped_status = fm.samples_dropped.labels("status")
    dropped_contract = fm.samples_dropped.labels("contract")
    without_prediction = fm.samples_without_prediction
    wait_s = loop.options.join_prediction_wait_s
    check_sample = SampleCheck()

    def class_waiting() -> int:  # also right after expiry and revocation
        return sum(1 for k in buffer.held_keys if UNTIL not in (buffer.held_value(k) or {}))

    fm.samples_held.set_function(class_waiting)

    def pair(node: str, completion: dict[str, Any], prediction: dict[str, Any]) -> None:
        matched.inc()
        if completion["status"] == "ok" and prediction["predicted_rtt_ms"] is not None:
            predicted = float(prediction["predicted_rtt_ms"])
            loop.tracker(node).add(completion["app"], predicted, float(completion["rtt_ms"]),
                                   model_ms=model_prediction(predicted, prediction.get("correction")),
                                   residual=serving(loop, prediction))
            loop.dirty_nodes.add(node)

    def emit_sample(c: dict[str, Any], partition: int, prediction: dict[str, Any] | None) -> bool:
        """Send the sample of ``c``; False when its node's class is not known yet (nothing sent)."""
        node = c["node"]
        state = store.state(node, partition, get_row)  # rebuilt from the changelog if not in memory yet
        node_class = class_of(state, prediction)
        if node_class is None:
            return False
        loop.node_class[node] = node_class
        tracker = loop.tracker(node)
        tracker.count_sample(c["app"])
        loop.dirty_nodes.add(node)
        window_s = tracker.window(c["app"])
        value = sample_value(c, node_class, state, window_s, prediction)
        key = value["model_key"]
        kb = key.encode()
        out_partition = partition_for(kb, samples_partitions)
        why: ContractError | None
        try:
            raw = encode("training-samples", value, check=False)
        except ContractError as exc:  # not even JSON (a value orjson cannot write)
            why, raw = exc, repr(value).encode("utf-8", "backslashreplace")
        else:
            why = check_sample(value, raw)
        if why is not None:  # a consumer would refuse it: a dead letter instead, never sent
            dropped_contract.inc()
            intake.refuse([(Unsent(samples_name, out_partition, kb, raw), "training-samples", why)])
            return True
        loop.samples_per_key[key] += 1
        if prediction is None:
            without_prediction.inc()
        counted = loop.handles.get("sample_counted")
        if counted is not None:  # a key without a model may ask its cold start now (feedback_errors)
            counted(key)
        # counted once the broker has it (count_delivered below)
        intake.sender.add(samples_name, out_partition, kb, raw)  # type: ignore[union-attr]
        return True

    def sample_or_hold(c: dict[str, Any], partition: int, prediction: dict[str, Any] | None) -> None:
        if c["status"] != "ok":
            dropped_status.inc()
        elif prediction is None and wait_s > 0:  # read before its prediction: it waits for it, a while
            buffer.hold((c["task_id"], c["node"]),
                        {"c": c, "partition": partition, "p": None, UNTIL: buffer.clock.now() + wait_s})
        elif not emit_sample(c, partition, prediction):
            # the node's metrics not read yet (the other intake may lag) and no prediction naming a model key:
            # the completion waits with its join entry, in the checkpoint too, until one of them comes
            buffer.hold((c["task_id"], c["node"]), {"c": c, "partition": partition, "p": prediction})

    def retry_held(key: tuple[str, str], h: dict[str, Any], now: float | None = None) -> None:
        """Send the sample of a held completion and let it go, if its node's class is known now and it waits for
        no prediction any more (it came, or its deadline passed: ``now`` at or past it)."""
        until = h.get(UNTIL)
        if until is not None and (now is None or now < until):
            return
        if emit_sample(h["c"], h["partition"], h["p"]):
            buffer.release(key)
        elif until is not None:  # its deadline passed and its node's class is not known: it waits for that now
            buffer.hold(key, {k: v for k, v in h.items() if k != UNTIL})

    def held_left(h: dict[str, Any]) -> bool:
        """A held value whose join entry left (expired or evicted): the sample of a completion that waited only for
        its prediction goes out without it now, as it would have at its deadline; False for one that waited for its
        node's class (it makes none). Entries leave only while a sender is up (``sending``,
        :meth:`~app.streams.feedback_state.FeedbackLoop.expire`)."""
        if UNTIL not in h:
            return False
        return emit_sample(h["c"], h["partition"], None)

    loop.handles["held_left"] = held_left

    def admit(node: str, app_name: str, partition: int) -> None:
        now = clock.monotonic()
        bounds.admit_app(app_name, now)  # app_cap / node_cap: the message goes to dead-letters
        bounds.admit_node(node, now, partition)

    def on_completion(c: dict[str, Any], partition: int) -> None:
        node = c["node"]
        admit(node, c["app"], partition)
        loop.partitions[node] = partition
        r = buffer.add_completion((c["task_id"], node), _completion_payload(c))
        if r.outcome == DUPLICATE:
            duplicate.inc()
            return
        if r.outcome == MATCHED:
            pair(node, r.completion, r.prediction)
        sample_or_hold(c, partition, r.prediction)

    def on_prediction(p: dict[str, Any], partition: int) -> None:
        node = p["node"]
        admit(node, p["app"], partition)
        loop.partitions[node] = partition
        r = buffer.add_prediction((p["task_id"], node), _prediction_payload(p), chosen=p.get("chosen") is True)
        if r.outcome == DUPLICATE:
            duplicate.inc()
        elif r.outcome == MATCHED:
            pair(node, r.completion, r.prediction)
            key = (p["task_id"], node)
            h = buffer.held_value(key)
            if h is not None:  # its completion waits for the prediction, or for the node's class it may name
                h = {"c": h["c"], "partition": h["partition"], "p": r.prediction}
                buffer.hold(key, h)
                retry_held(key, h)

    intake = PartitionIntake(settings, {"task-completions": on_completion, "rtt-predictions": on_prediction},
                             ctx.dead, name="feedback-join", clock=clock, metrics=loop.metrics,
                             request_timeout_ms=ctx.options.request_timeout_ms, health=ctx.health)
    intake.count_delivered("training-samples", fm.samples)
    loop.handles["sending"] = lambda: intake.sender is not None  # join entries leave only then (held_left)

    @app.task
    async def feedback_join() -> None:
        await intake.run()

    def retry_every_held() -> None:
        """Look at every held completion again (its node's class, its prediction's deadline)."""
        if intake.sender is not None:  # handlers and timers send on the running intake's producer
            now = buffer.clock.now()
            for key, h in buffer.held():
                retry_held(key, h, now)

    loop.handles["retry_held"] = retry_every_held

    @timer(app, HELD_RETRY_S, "feedback-held-samples")
    async def held_samples() -> None:
        retry_every_held()

    return intake
