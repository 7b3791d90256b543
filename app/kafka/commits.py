"""A consumer group's commits that follow the work, not the reads: up to, never past, the oldest message still open.

A consumer whose work on a message outlasts its read (the trainer: a retrain runs for minutes) must not
commit the message before its effect is durable, or a process stopped in between loses it: its
replacement starts after it. aiokafka's auto-commit commits what was *read*. :class:`CommitLedger` records
each offset read (:meth:`~CommitLedger.read` gives a :class:`Mark`) and when its work ended
(:meth:`~CommitLedger.done`); :meth:`~CommitLedger.due` gives, per partition, the offset to commit — the
oldest still open, or the one after the last read when none is — where it moved since the last commit.

Within one assignment an offset is handed out once (:meth:`~CommitLedger.read` returns None for one read
again). A partition assigned again starts afresh from the group's commit (:meth:`~CommitLedger.start`):
delivery is at least once.

>>> tp = TopicPartition("retrain-events", 0)
>>> ledger = CommitLedger()
>>> ledger.start(tp, 7)
>>> a, b, c = (ledger.read(tp, offset) for offset in (7, 8, 9))
>>> ledger.done(b); ledger.done(c); ledger.due()  # 7 still open: nothing to commit beyond it
{}
>>> ledger.read(tp, 8) is None  # read again (after a rebalance): done already
True
>>> ledger.done(a); ledger.due()
{TopicPartition(topic='retrain-events', partition=0): 10}
>>> ledger.committed({tp: 10}); ledger.due()
{}

:class:`GroupCommits` applies it to an ``AIOKafkaConsumer`` subscribed with ``enable_auto_commit=False``: as
its rebalance listener it checks the committed positions of assigned partitions
(:meth:`~app.kafka.positions.PositionGuard.check_committed`) and commits what is done of revoked ones; it
commits in the background (:meth:`GroupCommits.commit_soon`) and on stop (:meth:`GroupCommits.flush`). A
commit that fails (broker away, a rebalance in between) is logged and tried again with the next: never an
error to the caller.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from app.kafka.positions import PositionGuard

log = logging.getLogger(__name__)

COMMIT_TIMEOUT_S = 5.0  # one commit waits this long at most (aiokafka retries a retriable failure without end)


@dataclasses.dataclass(frozen=True, eq=False)
class Mark:
    """One message read, open until :meth:`CommitLedger.done` (matched by identity, so a mark from before a
    partition was forgotten never closes a message read after)."""

    tp: TopicPartition
    offset: int


@dataclasses.dataclass
class _Partition:
    next: int  # the offset after the last one read (or the start position)
    committed: int  # the last offset committed (or the group's, at assignment)
    open: dict[int, Mark] = dataclasses.field(default_factory=dict)
    done: set[int] = dataclasses.field(default_factory=set)  # done while an older one is open

    def commit_point(self) -> int:
        return min(self.open) if self.open else self.next


class CommitLedger:
    """Offsets read and done per partition; how far each partition may be committed."""

    def __init__(self) -> None:
        self._parts: dict[TopicPartition, _Partition] = {}

    def start(self, tp: TopicPartition, position: int) -> None:
        """``tp`` is read from ``position`` (the group's committed offset, or where a reset put it). What this
        ledger knew of it is forgotten: its offsets may be new messages (the broker lost the topic and the
        group's commits, and offsets start again), so a message read again is handed out again — its work
        runs twice at worst — and a mark from before never closes a message read after."""
        self._parts[tp] = _Partition(next=position, committed=position)

    def read(self, tp: TopicPartition, offset: int) -> Mark | None:
        """Note ``offset`` read; its mark, or None when its work is done or running already (read again)."""
        part = self._parts.get(tp)
        if part is None:  # never started (its assignment check failed): committed from what is read
            part = self._parts[tp] = _Partition(next=offset, committed=-1)
        if offset < part.commit_point() or offset in part.open or offset in part.done:
            return None
        part.next = offset + 1
        mark = part.open[offset] = Mark(tp, offset)
        return mark

    def done(self, mark: Mark) -> None:
        """The work on ``mark``'s message ended (its effect is durable, or it was dropped on purpose)."""
        part = self._parts.get(mark.tp)
        if part is None or part.open.get(mark.offset) is not mark:
            return  # forgotten (a reset, a revoked partition): not ours to commit
        del part.open[mark.offset]
        part.done.add(mark.offset)
        point = part.commit_point()
        part.done = {o for o in part.done if o >= point}

    def due(self, tps: Iterable[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        """Per partition (of ``tps``, default all), the offset to commit where it moved since the last commit."""
        wanted = None if tps is None else set(tps)
        out = {}
        for tp, part in self._parts.items():
            if wanted is not None and tp not in wanted:
                continue
            point = part.commit_point()
            if point > part.committed:
                out[tp] = point
        return out

    def committed(self, offsets: Mapping[TopicPartition, int]) -> None:
        """These offsets were committed."""
        for tp, offset in offsets.items():
            part = self._parts.get(tp)
            if part is not None:
                part.committed = max(part.committed, offset)

    def open_count(self) -> int:
        """Messages read whose work has not ended."""
        return sum(len(p.open) for p in self._parts.values())

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """Drop what is known of ``tps`` (their topic was recreated: offsets start again)."""
        for tp in tps:
            self._parts.pop(tp, None)


class GroupCommits(ConsumerRebalanceListener):  # type: ignore[misc]
    """Commits of one group consumer (``enable_auto_commit=False``) as its work ends; its rebalance listener.

    Parameters
    ----------
    consumer
        An ``AIOKafkaConsumer`` with a ``group_id``; subscribe it with ``listener=`` this object.
    guard
        The consumer's :class:`~app.kafka.positions.PositionGuard`: each assigned partition's committed offset
        is checked against the partition.
    timeout_s
        How long one commit may take before it is given up (and tried again with the next).
    """

    def __init__(self, consumer: Any, guard: PositionGuard, *, timeout_s: float = COMMIT_TIMEOUT_S) -> None:
        self.consumer = consumer
        self.guard = guard
        self.timeout_s = timeout_s
        self.ledger = CommitLedger()
        self.failures = 0  # commits that failed in a row
        self._task: asyncio.Task[bool] | None = None

    # -- what the consuming loop calls
    def read(self, tp: TopicPartition, offset: int) -> Mark | None:
        """See :meth:`CommitLedger.read`."""
        return self.ledger.read(tp, offset)

    def done(self, mark: Mark | None) -> None:
        if mark is not None:
            self.ledger.done(mark)

    def reset(self, positions: Mapping[TopicPartition, int]) -> None:
        """The guard moved these partitions to their start (recreated): what was read of them before is gone."""
        self.ledger.forget(positions)
        for tp, offset in positions.items():
            self.ledger.start(tp, offset)

    def commit_soon(self) -> None:
        """Commit what is due, in the background (one commit at a time)."""
        if self._task is not None and not self._task.done():
            return
        due = self._due()
        if due:
            self._task = asyncio.get_running_loop().create_task(self._commit(due), name=f"commit:{self.guard.client}")

    async def flush(self, tps: Iterable[TopicPartition] | None = None) -> bool:
        """Commit what is due now (of ``tps``, default every assigned partition); False if it could not be."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        return await self._commit(self._due(tps))

    # -- rebalance listener
    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        revoked = list(revoked)
        if revoked:
            await self.flush(revoked)  # the next owner starts after what is done here
        self.guard.forget(revoked)

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        assigned = list(assigned)
        try:  # not asyncio.wait_for: in Python 3.11 it drops a cancel that comes as the check is answered (as _commit)
            async with asyncio.timeout(self.timeout_s + self.guard.confirm_s):
                positions, reset = await self.guard.check_committed(assigned)
        except (KafkaError, TimeoutError) as exc:  # the broker went away: read on from the committed offsets
            log.warning("%s: read positions of %d partitions not checked (%r); reading from the group's "
                        "committed offsets", self.guard.client, len(assigned), exc)
            return
        self.ledger.forget(reset)  # recreated: what was read of them before is gone
        for tp, offset in positions.items():
            self.ledger.start(tp, offset)

    # -- committing
    def _due(self, tps: Iterable[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        assigned = self.consumer.assignment()
        return {tp: o for tp, o in self.ledger.due(tps).items() if tp in assigned}

    async def _commit(self, offsets: dict[TopicPartition, int]) -> bool:
        if not offsets:
            return True
        try:  # not asyncio.wait_for: in Python 3.11 it drops a cancel that comes as the commit is answered: the
            # consumer's rebalance, in which this listener runs, then ran on (into a JoinGroup) past the bound of
            # the trainer's stop that had cancelled it
            async with asyncio.timeout(self.timeout_s):
                await self.consumer.commit(offsets)
        except (KafkaError, TimeoutError) as exc:
            self.failures += 1
            level = logging.WARNING if self.failures == 1 else logging.DEBUG
            log.log(level, "%s: commit of %s failed (%r); tried again with the next", self.guard.client,
                    _offsets(offsets), exc)
            return False
        if self.failures:
            log.info("%s: commits work again (after %d failed)", self.guard.client, self.failures)
            self.failures = 0
        self.ledger.committed(offsets)
        return True


def _offsets(offsets: Mapping[TopicPartition, int]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]@{o}" for tp, o in sorted(offsets.items()))
