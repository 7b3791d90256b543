"""CommitLedger and GroupCommits: a group commits up to, never past, the oldest message whose work is open."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, KafkaTimeoutError
from prometheus_client import CollectorRegistry

from app.kafka.commits import CommitLedger, GroupCommits
from app.kafka.positions import PositionGuard

TP = TopicPartition("t-retrain-events", 1)
TP2 = TopicPartition("t-retrain-events", 2)


def test_the_commit_point_is_the_oldest_open_offset() -> None:
    ledger = CommitLedger()
    ledger.start(TP, 0)
    marks = [ledger.read(TP, o) for o in range(5)]
    assert all(m is not None for m in marks)
    for o in (4, 2, 1):
        ledger.done(marks[o])  # type: ignore[arg-type]
    assert ledger.due() == {}  # 0 is open
    ledger.done(marks[0])  # type: ignore[arg-type]
    assert ledger.due() == {TP: 3}  # 3 is open
    ledger.committed({TP: 3})
    ledger.done(marks[3])  # type: ignore[arg-type]
    assert ledger.due() == {TP: 5} and ledger.open_count() == 0


def test_a_message_read_again_is_handed_out_once_per_assignment() -> None:
    """Read twice within an assignment: handed out once. Assigned again from the group's commit: handed out
    again (at least once), and the marks from before close nothing."""
    ledger = CommitLedger()
    ledger.start(TP, 10)
    a, b, c = (ledger.read(TP, o) for o in (10, 11, 12))
    assert a is not None and b is not None and c is not None
    assert ledger.read(TP, 11) is None
    ledger.done(c)
    ledger.start(TP, 10)  # assigned again at the group's commit (10: a still open)
    again = [ledger.read(TP, o) for o in (10, 11, 12)]
    assert all(m is not None for m in again)
    ledger.done(a)
    ledger.done(b)
    assert ledger.due() == {} and ledger.open_count() == 3
    for m in again:
        ledger.done(m)  # type: ignore[arg-type]
    assert ledger.due() == {TP: 13}


def test_a_partition_whose_commits_the_broker_lost_is_read_again_from_its_start() -> None:
    """The broker lost everything (the group's commits too) and the topic was recreated: the partition comes
    back with no commit, from offset 0, and its new messages at offsets already read before are handed out."""
    ledger = CommitLedger()
    ledger.start(TP, 0)
    for o in range(3):
        mark = ledger.read(TP, o)
        assert mark is not None
        ledger.done(mark)
    ledger.start(TP, 0)
    assert ledger.read(TP, 0) is not None and ledger.read(TP, 1) is not None


def test_a_partition_assigned_past_what_is_known_drops_the_rest() -> None:
    """Another member committed past this one's open message: it is no longer this member's to commit."""
    ledger = CommitLedger()
    ledger.start(TP, 0)
    old = ledger.read(TP, 0)
    assert old is not None
    ledger.start(TP, 8)
    ledger.done(old)
    assert ledger.due() == {} and ledger.read(TP, 8) is not None


def test_a_mark_from_before_a_reset_never_closes_a_new_message() -> None:
    ledger = CommitLedger()
    ledger.start(TP, 0)
    old = ledger.read(TP, 0)
    assert old is not None
    ledger.forget([TP])  # the topic was recreated: offsets start again at 0
    ledger.start(TP, 0)
    new = ledger.read(TP, 0)
    ledger.done(old)
    assert new is not None and ledger.due() == {} and ledger.open_count() == 1


class Consumer:
    """What GroupCommits asks of a group consumer; ``fail`` makes commits fail with it."""

    def __init__(self) -> None:
        self.assigned = {TP, TP2}
        self.commits: list[dict[TopicPartition, int]] = []
        self.fail: Exception | None = None

    def assignment(self) -> set[TopicPartition]:
        return self.assigned

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self.fail is not None:
            raise self.fail
        self.commits.append(dict(offsets))

    async def committed(self, tp: TopicPartition) -> int | None:
        return 4

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: 0 for tp in tps}

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: 9 for tp in tps}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        pass


def commits(consumer: Consumer) -> GroupCommits:
    return GroupCommits(consumer, PositionGuard(consumer, "test", registry=CollectorRegistry()), timeout_s=0.1)


def test_a_failed_commit_is_logged_and_tried_again_with_the_next(caplog: Any) -> None:
    consumer = Consumer()
    group = commits(consumer)

    async def go() -> list[bool]:
        await group.on_partitions_assigned([TP, TP2])  # both at the group's commit, 4
        mark = group.read(TP, 4)
        group.done(mark)
        out = []
        for fail in (CommitFailedError("rebalanced"), KafkaTimeoutError(), None):
            consumer.fail = fail
            out.append(await group.flush())
        return out

    assert asyncio.run(go()) == [False, False, True]
    assert consumer.commits == [{TP: 5}] and group.failures == 0
    assert caplog.text.count("commit of t-retrain-events[1]@5 failed") == 1  # once per run of failures


def test_a_commit_that_hangs_is_given_up() -> None:
    consumer = Consumer()
    group = commits(consumer)

    async def hang(offsets: dict[TopicPartition, int]) -> None:
        await asyncio.sleep(60)

    consumer.commit = hang  # type: ignore[method-assign]

    async def go() -> bool:
        await group.on_partitions_assigned([TP])
        group.done(group.read(TP, 4))
        return await group.flush()

    assert asyncio.run(go()) is False


def test_revoked_partitions_commit_what_is_done_and_no_other_is_committed() -> None:
    consumer = Consumer()
    group = commits(consumer)

    async def go() -> None:
        await group.on_partitions_assigned([TP, TP2])
        group.done(group.read(TP, 4))
        running = group.read(TP, 5)  # its work goes on
        group.done(group.read(TP, 6))
        group.done(group.read(TP2, 4))
        await group.on_partitions_revoked([TP])
        consumer.assigned = {TP2}
        group.done(running)  # ended after the partition went to another member: not committed here
        group.commit_soon()
        await asyncio.sleep(0.01)

    asyncio.run(go())
    assert consumer.commits == [{TP: 5}, {TP2: 5}]
