"""The shared state of one worker's feedback loop (:class:`FeedbackLoop`), and its checkpoints.

The components of :mod:`app.streams.feedback_loop` (join, errors, weights) each receive this one object.
State lives in memory while the worker runs (the join buffer, one :class:`~app.drift.tracker.NodeTracker`
per node) and is written to a changelogged table (:mod:`~app.streams.feedback_table`) by
:meth:`FeedbackLoop.checkpoint`: every ``options.checkpoint_interval_s``, and in every error period
*before* prediction-errors are sent, so whatever an emitted period counted is already recorded as done —
a redelivered message is then a duplicate, and no pair is counted twice. A worker only holds the nodes
of the partitions it owns (rows are restored per active partition, dropped on revocation), so timers
never count a node twice.

When a new model version starts serving a key, the drift detectors and residual corrections of that
key's app on that class's nodes start afresh (:meth:`FeedbackLoop.model_swapped`): their reference
becomes the new model's error, and the old model's errors cannot mask or fake a drift; the node-features
of the nodes carry, from then on, the features the app's models read over the app's DWA window
(``app_features``). A drift the new model does not fix is signalled again by the node × app drift
episode (:class:`~app.drift.episode.DriftEpisode`), which compares the error with its pre-drift level.

An app retired from the worker (:mod:`app.streams.eviction`) leaves all of it (:meth:`FeedbackLoop.forget_apps`):
its state in every node's tracker (the node's row is written again without it by the next checkpoint, so a
restart does not bring it back), its DWA windows on the node states (their rows too), its sample counts and its models
(unloaded, kept as the announced key → version, sha256: :meth:`~app.streams.feedback_models.ModelCache.park`).
Named again, it starts afresh, and its models are loaded again from the registry (:meth:`FeedbackLoop.app_heard`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import orjson

from app.clock import Clock
from app.config import Settings
from app.contracts.keys import parse_model_key
from app.drift.joinbuffer import HELD, JoinBuffer
from app.drift.tracker import NodeTracker
from app.retry import Backoff
from app.streams.changelog import Row
from app.streams.feedback_models import ModelCache
from app.streams.feedback_options import FeedbackOptions
from app.streams.feedback_outbox import ErrorsOutbox
from app.streams.feedback_table import JOIN as JOIN_ROW
from app.streams.feedback_table import OFFSETS as OFFSETS_ROW
from app.streams.feedback_table import OUTBOX as OUTBOX_ROW
from app.streams.feedback_table import (
    FeedbackTable,
    join_row_key,
    node_row_key,
    offsets_row_key,
    parse_row_key,
    row_partition,
)
from app.streams.health import Health
from app.streams.intake import CheckpointTurns, PartitionIntake, decode_positions, revoke_timeout_s
from app.streams.metrics import WorkerMetrics
from app.streams.node_features import NodeFeatures

log = logging.getLogger(__name__)

OUTBOX_REASON = "errors_outbox"  # Health reason: restored prediction-errors not yet looked for in the topic


@dataclasses.dataclass
class FeedbackLoop:
    """What the feedback components share (one per worker app)."""

    settings: Settings
    options: FeedbackOptions
    clock: Clock
    nodes: NodeFeatures
    models: ModelCache
    buffer: JoinBuffer
    table: FeedbackTable
    metrics: WorkerMetrics = dataclasses.field(default_factory=WorkerMetrics)  # the worker app's
    health: Health = dataclasses.field(default_factory=Health)  # the worker app's
    trackers: dict[str, NodeTracker] = dataclasses.field(default_factory=dict)
    partitions: dict[str, int] = dataclasses.field(default_factory=dict)
    # evicted nodes whose join entries may still be held -> (their partition, when the last of those has expired)
    evicted: dict[str, tuple[int, float]] = dataclasses.field(default_factory=dict)
    node_class: dict[str, str] = dataclasses.field(default_factory=dict)
    samples_per_key: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    dirty_nodes: set[str] = dataclasses.field(default_factory=set)
    checkpoints: CheckpointTurns = dataclasses.field(default_factory=CheckpointTurns)  # one at a time
    on_forget_apps: list[Callable[[set[str]], None]] = dataclasses.field(default_factory=list)
    handles: dict[str, Any] = dataclasses.field(default_factory=dict)
    intake: PartitionIntake | None = None
    outbox: ErrorsOutbox | None = None
    held: set[int] = dataclasses.field(default_factory=set)  # partitions whose state is in memory
    _background: set[asyncio.Task[Any]] = dataclasses.field(default_factory=set)
    _deleted_rows: list[tuple[bytes, bytes | None]] = dataclasses.field(default_factory=list)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        """Run ``coro`` in the background, kept referenced until it is done."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def tracker(self, node: str) -> NodeTracker:
        t = self.trackers.get(node)
        if t is None:
            s, o = self.settings, self.options
            t = self.trackers[node] = NodeTracker.configured(
                window_s=s.feature_window_s, min_window_s=s.dwa_min_window_s, max_window_s=s.dwa_max_window_s,
                prior=s.credibility_prior, drift_delta=o.drift_delta, drift_threshold=o.drift_threshold,
                drift_min_instances=o.drift_min_instances, drift_jump=o.drift_jump)
        return t

    def model_swapped(self, key: str, version: int) -> None:
        """A new model serves ``key``: the drift detectors and residuals of its app on its class's nodes start
        afresh, and node-features carry what the app's models read over its DWA window."""
        app, node_class, node = parse_model_key(key)
        for n, tracker in self.trackers.items():
            if (node is None or node == n) and self.node_class.get(n) == node_class:
                tracker.new_model(app)
        self.nodes.store.app_names[app] = self.models.feature_names(app)

    def expire(self) -> bool:
        """Let old join keys leave (:meth:`~app.drift.joinbuffer.JoinBuffer.expire`); False when none may now.

        None leaves while the join's intake has no sender up (stopped, or not started yet): a completion waiting
        for its prediction makes its sample as its entry leaves, and with nowhere to send it the checkpoint
        would store the entry's removal while the sample lived only in memory. Its entries stay, checkpointed
        as they are, and leave on the first pass with a sender up.
        """
        sending = self.handles.get("sending")
        if sending is not None and not sending():
            return False
        for e in self.buffer.expire():
            if e.outcome == HELD:  # a completion waiting for its prediction makes its sample without it now;
                left = self.handles.get("held_left")  # one still waiting for its node's class makes none
                if left is None or not left(e.payload):
                    self.metrics.feedback.samples_dropped.labels("unknown_node").inc()
            else:
                self.metrics.feedback.join.labels(e.outcome).inc()
        self.metrics.feedback.join_entries.set(len(self.buffer))
        return True

    def join_partition(self, node: str) -> int | None:
        """The partition whose changelog holds the join rows of ``node``: its own, kept past its eviction while
        entries of it may be held (:meth:`forget_nodes`); None when no entry of it can be held."""
        p = self.partitions.get(node)
        if p is None and (left := self.evicted.get(node)) is not None:
            p = left[0]
        return p

    async def checkpoint(self) -> int:
        """Expire old join keys, then write every changed join entry and node tracker; rows written.

        A join entry's row (and its deletion) names its node's partition, an evicted node's included (its
        entries expire after it left; :meth:`join_partition`).

        The join's read positions are taken at the same instant as the state (no message is processed in
        between) and written after it, once the training samples of those messages are delivered: the write
        flushes the intake's sender, which sends again every sample the broker did not take and raises while
        one is undelivered (:class:`~app.kafka.batches.BatchSender`). A write that fails hands its changes
        back, so the next checkpoint stores them.
        """
        return await self.checkpoints.take(self._checkpoint)

    async def _checkpoint(self) -> int:
        held = self.checkpoints.holder()  # false for a partition once a revoke that did not wait for this returned
        now = self.buffer.clock.now()
        expired = self.expire()
        upserts, removed = self.buffer.take_changes()
        rows: list[tuple[bytes, bytes | None]] = []
        unknown: set[str] = set()
        changes: list[tuple[tuple[str, str], bytes | None]] = [(k, orjson.dumps(e)) for k, e in upserts.items()]
        changes += [(k, None) for k in removed]
        join_partitions: dict[tuple[str, str], int] = {}  # what is taken back on failure: rows of a known partition
        for (task_id, node), value in changes:
            partition = self.join_partition(node)
            if partition is None:
                unknown.add(node)
            else:
                join_partitions[(task_id, node)] = partition
                rows.append((join_row_key(partition, node, task_id), value))
        if unknown:  # no entry of a node whose partition is unknown is held: nothing is written in its place
            log.warning("join rows of %d node(s) of no known partition not written: %s", len(unknown),
                        sorted(unknown)[:10])
        dirty, self.dirty_nodes = self.dirty_nodes, set()
        for node in dirty:
            t = self.trackers.get(node)
            if t is not None and node in self.partitions:
                rows.append((node_row_key(self.partitions[node], node), orjson.dumps(t.to_dict())))
        outbox_rows = self.outbox.take_rows() if self.outbox is not None else []
        rows += outbox_rows
        deleted, self._deleted_rows = self._deleted_rows, []
        rows += deleted
        intake = self.intake
        positions: list[Row] = []
        try:
            if intake is None:
                n = await self.table.write(rows, held=held)
            else:
                positions = intake.position_rows(offsets_row_key)
                n = await self.table.write(rows, last=positions, sender=intake.live_sender, held=held)
                intake.positions_stored([r for r in positions if held(r[0])])  # the messages they cover are counted now
        except BaseException:  # not stored (broker away): the next checkpoint writes these changes again
            if intake is not None:  # the positions stored, the markers after them not: counted all the same
                intake.positions_held([r for r in positions if held(r[0])], self.table.data)
            # but not those of partitions revoked meanwhile: forgotten, their new owner's
            self.buffer.retake([k for k in upserts if _mine(held, join_partitions.get(k))],
                               [k for k in removed if _mine(held, join_partitions.get(k))])
            self.dirty_nodes |= {n for n in dirty if _mine(held, self.partitions.get(n))}
            self._deleted_rows = [r for r in deleted if _mine(held, row_partition(r[0]))] + self._deleted_rows
            raise
        if self.evicted and expired:  # every entry an evicted node had is expired, and its deletion stored
            self.evicted = {n: left for n, left in self.evicted.items() if left[1] > now}
        if self.outbox is not None:
            self.outbox.written([r for r in outbox_rows if _mine(held, row_partition(r[0]))])
            if self.outbox.send is not None:
                await self.outbox.deliver()  # what this checkpoint made durable
        return n

    def restore(self, rows: dict[bytes, bytes], active: set[int]) -> None:
        """Load the rows of newly active partitions (join entries and trackers not already in memory).

        Partitions this worker held before the rebalance and still holds keep their state in memory: it is
        newer than the table's rows, into which Faust's recovery has just replayed the changelog up to an
        end it took while the last checkpoint was being written, bringing back rows deleted since (an
        outbox row of a message already delivered would be sent again).
        """
        fresh = active - self.held
        self.held |= active
        entries: dict[tuple[str, str], dict[str, Any]] = {}
        offsets: dict[tuple[str, int], int] = {}
        for key, value in rows.items():
            parsed = parse_row_key(key)
            if parsed is None:
                continue
            partition, kind, node, task_id = parsed
            if partition not in fresh:
                continue
            if kind == OFFSETS_ROW:
                offsets.update(decode_positions(value, partition))
                continue
            if kind == OUTBOX_ROW:
                if self.outbox is not None:
                    self.outbox.restore(partition, key, value)
                continue
            self.partitions.setdefault(node, partition)
            if kind == JOIN_ROW:
                if (task_id, node) not in self.buffer:
                    entries[(task_id, node)] = orjson.loads(value)
            elif node not in self.trackers:
                self.tracker(node).load(orjson.loads(value))
        self.buffer.load(entries)
        self.metrics.feedback.join_entries.set(len(self.buffer))
        if self.intake is not None:
            self.intake.assign(active, offsets)
        if self.outbox is not None and fresh and len(self.outbox):
            self.spawn(self._reconcile(fresh), "outbox-reconcile")
        log.info("partitions %s: restored %d join entries, %d node trackers, join positions %s (state kept in"
                 " memory: %s)", sorted(active), len(entries), len(self.trackers),
                 {f"{n}[{p}]": o for (n, p), o in sorted(offsets.items())}, sorted(active - fresh) or "none")

    def rewrite(self, partitions: set[int]) -> None:
        """Mark everything kept of ``partitions`` to be written by the next checkpoint (their changelog topic
        was recreated empty while this worker held them): trackers, join entries, outbox entries."""
        self.metrics.changelog_rewinds.labels("feedback").inc(len(partitions))
        nodes = {n for n, p in self.partitions.items() if p in partitions}
        self.dirty_nodes |= nodes & self.trackers.keys()
        self.buffer.retake([k for k in self.buffer.keys() if self.join_partition(k[1]) in partitions], ())
        if self.outbox is not None:
            self.outbox.rewrite(partitions)

    def forget_nodes(self, nodes: set[str]) -> None:
        """Drop silent ``nodes`` (evicted): trackers, classes, and their tracker rows in the next checkpoint.

        Their join entries expire on their own, within the join's TTL (at once when RTT_NODE_EVICT_AFTER_S is
        not below it, but for an entry younger than the node's last message): each node's partition is kept
        until then (:attr:`evicted`), so their rows are deleted from the partition they are in.
        """
        until = self.buffer.clock.now() + self.buffer.ttl_s
        for node in nodes:
            self.trackers.pop(node, None)
            self.node_class.pop(node, None)
            self.dirty_nodes.discard(node)
            partition = self.partitions.pop(node, None)
            if partition is not None:
                self._deleted_rows.append((node_row_key(partition, node), None))
                self.evicted[node] = (partition, until)

    def apps(self) -> set[str]:
        """Every app some state of this loop holds: trackers, sample counts, loaded models, node windows."""
        out = self.models.apps() | {parse_model_key(k)[0] for k in self.samples_per_key}
        for t in self.trackers.values():
            out.update(t.apps)
        for st in self.nodes.store.states.values():
            out.update(st.windows)
        return out

    def forget_apps(self, apps: set[str]) -> dict[str, int]:
        """Release everything kept of retired ``apps``; what was released, counted.

        Their state leaves every node's tracker (the node's row is rewritten by the next checkpoint), their DWA
        windows leave the node states (the node's meta row is rewritten by the node table's next checkpoint),
        their sample counts go, and their models are unloaded
        (:meth:`~app.streams.feedback_models.ModelCache.park`); ``on_forget_apps`` callbacks drop what the
        components keep per model key.
        """
        trackers = 0
        for node, t in self.trackers.items():
            if t.forget(apps):
                trackers += 1
                self.dirty_nodes.add(node)
        keys = [k for k in self.samples_per_key if parse_model_key(k)[0] in apps]
        for k in keys:
            del self.samples_per_key[k]
        store = self.nodes.store
        for app in apps:
            store.app_names.pop(app, None)
        for st in store.states.values():
            if any(app in st.windows for app in apps):
                st.windows = {a: w for a, w in st.windows.items() if a not in apps}
                st.meta_dirty = True
        models = self.models.park(apps)
        for callback in self.on_forget_apps:
            callback(apps)
        return {"trackers": trackers, "sample_keys": len(keys), "models": len(models)}

    def app_heard(self, app: str) -> None:
        """``app`` is named again after it was retired: load its models again (in the background)."""
        for update in self.models.unpark(app):
            self.spawn(self.models.apply(update), f"reload {update['model_key']}")

    async def _reconcile(self, partitions: set[int]) -> None:
        """Restored outbox entries: clear those already in the topic, send the others.

        Looking for them is retried until it succeeds (while the partitions are held): an entry not looked
        for is never sent. Meanwhile the worker is degraded (``errors_outbox``).
        """
        outbox = self.outbox
        assert outbox is not None

        def failed(tries: int, exc: BaseException) -> None:
            detail = f"prediction-errors outbox of partitions {sorted(partitions)} not reconciled yet: {exc!r}"
            self.health.degraded(OUTBOX_REASON, detail)
            log.warning("%s (try %d, tried again)", detail, tries)

        await outbox.reconcile_until_done(lambda: partitions & self.held,
                                          Backoff.upto(self.settings.retry_max_backoff_s), on_failure=failed)
        if not outbox.unchecked():
            self.health.recovered(OUTBOX_REASON)
        try:
            await self.checkpoint()
        except Exception as exc:  # broker away: the next checkpoints deliver what is left (never lost)
            log.warning("prediction-errors outbox of partitions %s reconciled; not delivered yet: %r",
                        sorted(partitions), exc)

    async def revoke(self, lost: set[int]) -> None:
        """Stop reading ``lost`` partitions, checkpoint, then forget their nodes (their new owner restores them):
        join entries, trackers, partitions and classes, and their read positions.

        They are forgotten even when the checkpoint fails (raised after): the rows of a checkpoint go out before
        its read positions, and those only once the rows are stored, so the positions last stored never run ahead
        of the stored state, and the new owner reads again from them whatever was not stored. Nothing of ``lost``
        is written by this worker afterwards: no state of it is left, nor positions. The checkpoint waits for the
        one in flight, and takes at most one request timeout in all; it writes nothing when the one it waited for
        failed (:meth:`~app.streams.intake.CheckpointTurns.revoke`: a revoke never holds a rebalance up for two).
        The checkpoint in flight, if the revoke returns before it ends, leaves ``lost`` be from then on: it writes,
        counts and delivers nothing more of it, and takes none of its changes back when it fails.
        """
        if self.intake is not None:
            self.intake.release(lost)
        self.held -= lost
        try:
            await self.checkpoints.revoke(self._checkpoint, revoke_timeout_s(self.intake), lost)
        finally:
            self._forget_partitions(lost)

    def _forget_partitions(self, lost: set[int]) -> None:
        gone = {n for n, p in self.partitions.items() if p in lost}
        evicted = {n for n, (p, _) in self.evicted.items() if p in lost}
        self.buffer.drop(lambda k: k[1] not in gone and k[1] not in evicted)
        for n in gone:
            self.trackers.pop(n, None)
            self.partitions.pop(n, None)
            self.node_class.pop(n, None)
        for n in evicted:
            del self.evicted[n]
        self._deleted_rows = [(k, v) for k, v in self._deleted_rows if row_partition(k) not in lost]
        if self.outbox is not None:
            self.outbox.drop(lost)
        if self.intake is not None:
            self.intake.forget(lost)
        log.info("partitions %s revoked: dropped the feedback state of %d nodes", sorted(lost), len(gone))


def _mine(held: Callable[[int], bool], partition: int | None) -> bool:
    """Whether a checkpoint may still write or take back what it took of ``partition`` (None: of no partition
    known, so not)."""
    return partition is not None and held(partition)
