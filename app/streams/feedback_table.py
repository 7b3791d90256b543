"""The changelogged table of the feedback loop: join entries and node trackers, written in checkpoints.

Row keys carry the source partition they belong to, so rows can be written outside stream iteration
(the checkpoint timer) and land in the changelog partition a worker taking over that partition recovers::

    b"{partition}|j|{node}|{task_id}"   one join entry (JoinBuffer.export, orjson)
    b"{partition}|n|{node}"             one node's tracker (NodeTracker.to_dict, orjson)
    b"{partition}|o|"                   the join's read positions in that partition (orjson, by topic)
    b"{partition}|e|{node}|{ts}"        a prediction-errors message not yet acknowledged (the outbox,
                                        app.streams.feedback_outbox)

A node name is written with ``%`` and ``|`` escaped (``%25``, ``%7C``), so a ``|`` in it cannot move the
boundary to the next field; names without either are written as they are. A task id, the last field, is
written as it is (it runs to the key's end). An outbox row's key is read for its partition only: the
message's node and time are in the row's value.

A checkpoint writes the changed rows (a deletion is a tombstone) and waits for them, then the positions
row, then the markers (:func:`app.streams.changelog.write_rows`): recorded positions never run ahead of
the state they describe. After a recovery the table
hands the rows of its active partitions to ``on_restore``; on a rebalance it calls ``on_revoke`` with the
partitions lost (which checkpoints them), then removes their rows from its in-memory data
(:func:`~app.streams.changelog.drop_partitions`): a partition that comes back is read again from its changelog.
A revoke that fails (its checkpoint not stored: the broker away) is logged on one line and counted in
``rtt_worker_revoke_checkpoint_failures_total{table}``, and the rows go all the same; nothing escapes
``on_rebalance``, on which Faust would crash the app. Either way, whatever the sender the rows were written on
still holds of those changelog partitions (rows or read positions not delivered) is discarded
(:meth:`~app.kafka.batches.BatchSender.discard`): their new owner writes them from then on, and this worker
writes nothing of them afterwards.

>>> join_row_key(3, "gpu-1", "task|7")
b'3|j|gpu-1|task|7'
>>> parse_row_key(b'3|j|gpu-1|task|7')
(3, 'j', 'gpu-1', 'task|7')
>>> parse_row_key(b'5|n|gpu-1')
(5, 'n', 'gpu-1', '')
>>> parse_row_key(b'#checkpoint') is None
True
>>> join_row_key(0, "gpu|r1", "t"), join_row_key(0, "gpu", "r1|t")
(b'0|j|gpu%7Cr1|t', b'0|j|gpu|r1|t')
>>> parse_row_key(node_row_key(0, "rack%7C|gpu"))
(0, 'n', 'rack%7C|gpu', '')
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import faust

from app.kafka.batches import BatchSender
from app.streams.changelog import Row, drop_partitions, write_rows
from app.streams.node_table import revoke_failed, revoke_failures
from app.streams.ownership import lost_partitions

log = logging.getLogger(__name__)

JOIN, NODE, OFFSETS, OUTBOX = "j", "n", "o", "e"
RowKey = tuple[int, str, str, str]


def _escape(name: str) -> str:
    return name.replace("%", "%25").replace("|", "%7C") if "%" in name or "|" in name else name


def _unescape(field: str) -> str:
    return field.replace("%7C", "|").replace("%25", "%") if "%" in field else field


def join_row_key(partition: int, node: str, task_id: str) -> bytes:
    return f"{partition}|{JOIN}|{_escape(node)}|{task_id}".encode()


def node_row_key(partition: int, node: str) -> bytes:
    return f"{partition}|{NODE}|{_escape(node)}".encode()


def offsets_row_key(partition: int) -> bytes:
    return f"{partition}|{OFFSETS}|".encode()


def parse_row_key(key: bytes | str) -> RowKey | None:
    """``(partition, kind, node, task_id)`` of a row key ('' task for a node row); None for other keys."""
    k = key.decode() if isinstance(key, bytes) else key
    parts = k.split("|", 3)
    if len(parts) < 3 or not parts[0].isdigit() or parts[1] not in (JOIN, NODE, OFFSETS, OUTBOX):
        return None
    return int(parts[0]), parts[1], _unescape(parts[2]), parts[3] if len(parts) == 4 else ""


def row_partition(key: bytes | str) -> int | None:
    """The partition a row key carries; None for other keys (the checkpoint marker)."""
    parsed = parse_row_key(key)
    return parsed[0] if parsed is not None else None


class FeedbackTable(faust.Table):
    """Rows of the join buffer and node trackers; a row's changelog partition is in its key."""

    ownership_topic: str = ""
    on_restore: Callable[[dict[bytes, bytes], set[int]], None] | None = None
    on_revoke: Callable[[set[int]], Awaitable[None]] | None = None
    on_stopping: Callable[[], Awaitable[int]] | None = None
    on_rewound: Callable[[set[int]], None] | None = None
    revoke_failures: Any = None  # its rtt_worker_revoke_checkpoint_failures_total{table} child (feedback_table)
    sender: BatchSender | None = None  # the last sender rows were written on (the join intake's)

    def partition_for_key(self, key: Any) -> int | None:
        partition = row_partition(key)
        return partition if partition is not None else super().partition_for_key(key)

    async def write(self, rows: Iterable[tuple[bytes, bytes | None]], *, last: Iterable[Row] = (),
                    sender: BatchSender | None = None, held: Callable[[int], bool] | None = None) -> int:
        """Write ``rows`` (value None: delete), then ``last`` once ``rows`` are stored; rows written.

        With ``sender`` the rows go out as record batches on its producer; without, through Faust
        (:func:`~app.streams.changelog.write_rows`, which leaves out the partitions ``held`` says were revoked).
        """
        if sender is not None:
            self.sender = sender
        return await write_rows(self, [_row(k, v) for k, v in rows], last=last, sender=sender,
                                on_rewound=self.on_rewound, held=held)

    def discard_undelivered(self, partitions: set[int]) -> int:
        """Drop what the sender rows were written on still holds of the changelog ``partitions`` (lost: their new
        owner writes them now), so that it never lands after the new owner's rows; records dropped."""
        if not isinstance(self.sender, BatchSender):  # rows only ever went through Faust's producer
            return 0
        return self.sender.discard(self.changelog_topic.get_topic_name(), partitions)

    async def on_rebalance(self, assigned: Any, revoked: Any, newly_assigned: Any, generation_id: int = 0) -> None:
        lost = lost_partitions(revoked, self.ownership_topic)
        if lost:
            if self.on_revoke is not None:
                try:
                    await self.on_revoke(lost)  # forgets the partitions' state even when its checkpoint fails
                except Exception as exc:  # broker away: the new owner reads again from the positions last stored
                    revoke_failed(self.name, lost, exc, self.revoke_failures)
            self.discard_undelivered(lost)  # not sent again once the new owner writes the partitions
            n = drop_partitions(self.data, lost, row_partition)
            log.info("partitions %s revoked: dropped %d feedback rows from memory", sorted(lost), n)
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)

    async def on_stop(self) -> None:
        if self.on_stopping is not None:
            try:
                n = await self.on_stopping()
                log.info("stopping: checkpointed %d feedback rows", n)
            except Exception as exc:  # the producer may be gone already; a restart then re-reads more
                log.warning("stopping: feedback checkpoint failed: %r", exc)
        await super().on_stop()

    async def on_recovery_completed(self, active_tps: Any, standby_tps: Any) -> None:
        await super().on_recovery_completed(active_tps, standby_tps)
        changelog = self.changelog_topic.get_topic_name()
        active = {tp.partition for tp in active_tps if tp.topic == changelog}
        if self.on_restore is not None and active:
            rows = {k: v for k, v in self.data.items()
                    if v is not None and (p := parse_row_key(k)) is not None and p[0] in active}
            self.on_restore(rows, active)


def _row(key: bytes, value: bytes | None) -> Row:
    parsed = parse_row_key(key)
    if parsed is None:
        raise ValueError(f"not a feedback row key: {key!r}")
    return parsed[0], key, value


def feedback_table(app: faust.App, name: str, ownership_topic: str, partitions: int) -> FeedbackTable:
    """Create and register the table on ``app``."""
    table = FeedbackTable(
        app, name=name, default=None, beacon=app.tables.beacon, partitions=partitions,
        key_type=bytes, value_type=bytes, help="feedback rows: join entries and node trackers",
    )
    table.ownership_topic = ownership_topic
    table.revoke_failures = revoke_failures(app, name)
    return app.tables.add(table)  # type: ignore[return-value]
