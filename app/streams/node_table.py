"""The node states of the partitions this worker owns, and the changelogged table that persists them.

:class:`NodeStateTable` is a Faust table whose changelog partition of a row is the node-metrics partition
its node came from (so a worker that takes over a partition recovers exactly those nodes' rows), which
also lets rows be written outside stream iteration (the checkpoint timer). On a rebalance, the states of
revoked partitions are checkpointed and dropped from memory, their rows with them
(:func:`~app.streams.changelog.drop_partitions`); a partition that comes back is read again from its
changelog, and a node seen again is rebuilt from the recovered rows. A clean stop checkpoints too.
A revoke whose checkpoint fails (the broker away, a batch not delivered) is logged on one line and counted in
``rtt_worker_revoke_checkpoint_failures_total{table}`` (partitions), and the states are dropped all the same: what
that checkpoint did not store is read again by the partitions' new owner from the positions last stored, which
never run ahead of the rows stored before them. An exception out of ``on_rebalance`` would end the worker (Faust
crashes the app on it). Either way, whatever the intake's sender still holds of those changelog partitions (rows
or read positions not delivered: the broker away) is discarded before the states go
(:meth:`~app.kafka.batches.BatchSender.discard`): their new owner writes them from then on, and this worker
writes nothing of them afterwards. While the revoke's checkpoint is written, the partitions' states are
:attr:`NodeStore.leaving`, and eviction leaves them alone. Checkpoints run one at a time: a revoke's waits
for the one in flight, and the revoke's checkpoint takes at most one request timeout in all
(``WorkerOptions.request_timeout_ms``, 40 s); past it, or when the checkpoint it waited for failed, the revoke
takes the failed path above (:class:`~app.streams.intake.CheckpointTurns`). Once the revoke returns, the
checkpoint it did not wait for writes nothing more of those partitions, puts none of their rows back in memory,
counts none of their messages and takes none of their rows back when it fails (the revoke fences it).

Each checkpoint records, after the rows, the node-metrics read position of every partition whose state
it wrote (row ``#positions|{partition}``; :mod:`app.streams.changelog` says how and why the markers), and
the node-features intake reads on from there after a recovery.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import faust

from app.errors import ConfigError
from app.kafka.batches import BatchSender
from app.streams.changelog import Row, drop_partitions, write_rows
from app.streams.context import context_of
from app.streams.intake import CheckpointTurns, PartitionIntake, decode_positions, revoke_timeout_s
from app.streams.node_state import META, NodeState, node_of_key, row_key
from app.streams.options import WorkerOptions
from app.streams.ownership import lost_partitions

log = logging.getLogger(__name__)

def revoke_failures(app: faust.App, table: str) -> Any:
    """The ``rtt_worker_revoke_checkpoint_failures_total{table}`` child of ``table``
    (:class:`~app.streams.metrics.WorkerMetrics`); None for an app not built by ``create_app``."""
    try:
        return context_of(app).metrics.revoke_failures.labels(table)
    except ConfigError:
        return None


def revoke_failed(table: str, lost: set[int], exc: BaseException, counter: Any) -> None:
    """Log (one line) and count a revoke whose checkpoint of ``lost`` failed with ``exc``."""
    if counter is not None:
        counter.inc(len(lost))
    log.warning("partitions %s revoked: their last %s checkpoint was not stored (%r); their state leaves memory"
                " all the same, and their new owner reads again from the checkpoint last stored", sorted(lost),
                table, exc)


class NodeStore:
    """In-memory :class:`NodeState` per node, created or rebuilt on a node's first message."""

    def __init__(self, window_s: float, options: WorkerOptions, emit_interval_s: float) -> None:
        self.window_s = window_s
        self.options = options
        self.emit_interval_s = emit_interval_s
        self.states: dict[str, NodeState] = {}
        # partitions being revoked: their states are checkpointed, then dropped; nothing else is done with them
        self.leaving: set[int] = set()
        self.app_names: dict[str, frozenset[str]] = {}  # app -> features its models read (set by the feedback loop)

    def state(self, node: str, partition: int, get: Callable[[bytes], bytes | None]) -> NodeState:
        s = self.states.get(node)
        if s is None:
            o = self.options
            s = NodeState.restore(node, partition, get, window_s=min(self.window_s, o.history_s),
                                  history_s=o.history_s, bucket_s=o.bucket_s, max_metrics=o.max_metrics)
            if s.window.newest >= 0:
                log.info("node %s: window rebuilt from the changelog (%d metrics)", node, len(s.window.names))
            self.states[node] = s
        return s

    def due(self, now: float) -> list[NodeState]:
        """States with unsent changes whose last emit is at least the emit interval old."""
        limit = now - self.emit_interval_s
        return [s for s in self.states.values() if s.pending and s.last_emit <= limit]

    def partition_of(self, node: str) -> int | None:
        s = self.states.get(node)
        return s.partition if s is not None else None

    def slots(self) -> int:
        """Ring slots of a node's window (its changelog rows are ``{node}#0`` .. ``#{slots - 1}`` and meta)."""
        o = self.options
        return NodeState.new("-", 0, window_s=min(self.window_s, o.history_s), history_s=o.history_s,
                             bucket_s=o.bucket_s, max_metrics=1).window.n_buckets

    def drop_partitions(self, partitions: set[int]) -> int:
        gone = [n for n, s in self.states.items() if s.partition in partitions]
        for n in gone:
            del self.states[n]
        return len(gone)


def positions_key(partition: int) -> bytes:
    """The row holding the node-metrics read position of ``partition`` (no node is named ``""``)."""
    return f"#positions|{partition}".encode()


class NodeStateTable(faust.Table):
    """Changelogged rows of node states; the row's partition follows its node's source partition."""

    store: NodeStore
    ownership_topic: str
    intake: PartitionIntake | None = None
    rewinds: Any = None  # the worker's rtt_worker_changelog_rewinds_total{table} child, set on registration
    revoke_failures: Any = None  # its rtt_worker_revoke_checkpoint_failures_total{table} child (node_state_table)

    def partition_for_key(self, key: Any) -> int | None:
        p = self.store.partition_of(node_of_key(key))
        return p if p is not None else super().partition_for_key(key)

    async def checkpoint(self, states: Iterable[NodeState] | None = None, partitions: set[int] | None = None) -> int:
        """Write the changed rows of ``states`` (default: all) and the read positions of ``partitions``.

        ``partitions`` must be those whose every state is in ``states`` (default: all held): a position is
        recorded only with the state it produced. One checkpoint at a time (:attr:`checkpoints`).
        """
        return await self.checkpoints.take(lambda: self._write(states, partitions))

    async def _write(self, states: Iterable[NodeState] | None, partitions: set[int] | None) -> int:
        held = self.checkpoints.holder()  # false for a partition once a revoke that did not wait for this returned
        rows: list[Row] = [(state.partition, key, row)
                           for state in (list(self.store.states.values()) if states is None else states)
                           for key, row in state.take_rows()]
        intake = self.intake
        positions: list[Row] = []
        try:
            if intake is None:
                return await write_rows(self, rows, held=held)
            positions = intake.position_rows(positions_key, partitions)
            n = await write_rows(self, rows, last=positions, sender=intake.live_sender, on_rewound=self.rewrite,
                                 held=held)
            intake.positions_stored([r for r in positions if held(r[0])])  # the messages they cover are counted now
            return n
        except BaseException:  # not stored (broker away): the next checkpoint writes these rows again
            if intake is not None:  # the positions stored, the markers after them not: counted all the same
                intake.positions_held([r for r in positions if held(r[0])], self.data)
            states_held = self.store.states
            for partition, key, _ in rows:
                state = states_held.get(node_of_key(key))
                if state is not None and held(partition):  # a revoked partition's rows are its new owner's
                    state.retake((key,))
            raise

    @property
    def checkpoints(self) -> CheckpointTurns:
        """Taken by each checkpoint: one at a time, so a revoke's checkpoint waits for the one in flight (at most
        one request timeout, :meth:`CheckpointTurns.revoke`), and a partition's positions, and the messages they
        cover, are forgotten only once no write of them is pending, or past that timeout, its records of them not
        yet handed to the producer discarded (:meth:`discard_undelivered`)."""
        turns = self.__dict__.get("_checkpoints")
        if turns is None:
            turns = self.__dict__["_checkpoints"] = CheckpointTurns()
        return turns

    def rewrite(self, partitions: set[int]) -> None:
        """Mark every row of the states of ``partitions`` to be written by the next checkpoint (their changelog
        topic was recreated empty while this worker held them)."""
        if self.rewinds is not None:
            self.rewinds.inc(len(partitions))
        for state in self.store.states.values():
            if state.partition in partitions:
                state.rewrite()

    def tombstone_nodes(self, nodes: dict[str, int]) -> int:
        """Delete every changelog row of ``nodes`` (``{node: partition}``) now; rows deleted.

        Synchronous: the tombstones go out with the intake's next batch (or through Faust's producer).
        """
        slots = self.store.slots()
        sender = self.intake.live_sender if self.intake is not None else None
        topic = self.changelog_topic.get_topic_name()
        n = 0
        for node, partition in nodes.items():
            for key in [row_key(node, slot) for slot in range(slots)] + [row_key(node, META)]:
                if self.data.pop(key, None) is None:
                    continue
                n += 1
                if sender is not None:
                    sender.add(topic, partition, key, None)
                else:
                    self.send_changelog(partition, key, None)
        return n

    def discard_undelivered(self, partitions: set[int]) -> int:
        """Drop what the intake's sender still holds of the changelog ``partitions`` (lost: their new owner writes
        them now), so that it never lands after the new owner's rows; records dropped."""
        sender = self.intake.live_sender if self.intake is not None else None
        if not isinstance(sender, BatchSender):  # the intake is not running: nothing of it is sent any more
            return 0
        return sender.discard(self.changelog_topic.get_topic_name(), partitions)

    def drop_rows(self, partitions: set[int]) -> int:
        """Remove from the in-memory rows those of ``partitions``: the rows of their nodes held in the store (call
        it before the store drops them) and their read positions; how many. Nothing is written to the changelog."""
        nodes = {n: s.partition for n, s in self.store.states.items() if s.partition in partitions}
        positions = {positions_key(p): p for p in partitions}
        return drop_partitions(self.data, partitions, lambda key: positions.get(key, nodes.get(node_of_key(key))))

    async def on_rebalance(self, assigned: Any, revoked: Any, newly_assigned: Any, generation_id: int = 0) -> None:
        lost = lost_partitions(revoked, self.ownership_topic)
        if lost:
            self.store.leaving |= lost
            try:
                if self.intake is not None:
                    self.intake.release(lost)
                states = [s for s in self.store.states.values() if s.partition in lost]
                try:
                    await self.checkpoints.revoke(lambda: self._write(states, lost), revoke_timeout_s(self.intake),
                                                  lost)
                except Exception as exc:  # broker away: the new owner reads again from the positions last stored
                    revoke_failed(self.name, lost, exc, self.revoke_failures)
                self.discard_undelivered(lost)  # not sent again once the new owner writes the partitions
                rows = self.drop_rows(lost)
                log.info("partitions %s revoked: dropped %d node states, %d rows from memory", sorted(lost),
                         self.store.drop_partitions(lost), rows)
                if self.intake is not None:
                    self.intake.forget(lost)
            finally:
                self.store.leaving -= lost
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)

    async def on_recovery_completed(self, active_tps: Any, standby_tps: Any) -> None:
        await super().on_recovery_completed(active_tps, standby_tps)
        changelog = self.changelog_topic.get_topic_name()
        active = {tp.partition for tp in active_tps if tp.topic == changelog}
        if self.intake is None or not active:
            return
        offsets: dict[tuple[str, int], int] = {}
        for p in active:
            raw = self.data.get(positions_key(p))
            if raw:
                offsets.update(decode_positions(raw, p))
        self.intake.assign(active, offsets)
        log.info("partitions %s: node-metrics read from %s", sorted(active),
                 {f"{n}[{p}]": o for (n, p), o in sorted(offsets.items())} or "the beginning")

    async def on_stop(self) -> None:
        try:
            n = await self.checkpoint()
            log.info("stopping: checkpointed %d node window rows", n)
        except Exception as exc:  # the producer may be gone already; a restart then re-reads more
            log.warning("stopping: checkpoint failed: %r", exc)
        await super().on_stop()


def node_state_table(app: faust.App, name: str, store: NodeStore, ownership_topic: str,
                     partitions: int) -> NodeStateTable:
    """Create and register the table on ``app``."""
    table = NodeStateTable(
        app, name=name, default=None, beacon=app.tables.beacon, partitions=partitions,
        key_type=bytes, value_type=bytes, help="node window rows: b'{node}#{slot}' and b'{node}#meta'",
    )
    table.store = store
    table.ownership_topic = ownership_topic
    table.revoke_failures = revoke_failures(app, name)
    return app.tables.add(table)  # type: ignore[return-value]
