"""PositionGuard against a scripted consumer: when a position is reset, to what, and when it is left alone."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from app.kafka.positions import PositionGuard

TP = TopicPartition("t-node-metrics", 3)


class Consumer:
    """What the guard asks of an aiokafka consumer: offsets, high watermarks, seeks."""

    def __init__(self, start: int = 0, end: int = 100, high: int | None = 100) -> None:
        self.start, self.end, self.high = start, end, high
        self.at = start  # the consumer's own position
        self.seeks: list[tuple[TopicPartition, int]] = []

    def assignment(self) -> set[TopicPartition]:
        return {TP}

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.high

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.start for tp in tps}

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.end for tp in tps}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))

    async def position(self, tp: TopicPartition) -> int:
        return self.at


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def guard(consumer: Consumer, clock: Clock | None = None) -> tuple[PositionGuard, CollectorRegistry]:
    reg = CollectorRegistry()
    return PositionGuard(consumer, "test", registry=reg, topic_label=lambda _t: "node-metrics",
                         clock=clock or Clock()), reg


def resets(reg: CollectorRegistry, reason: str) -> float:
    v = reg.get_sample_value("rtt_kafka_position_resets_total",
                             {"client": "test", "topic": "node-metrics", "reason": reason})
    return v or 0.0


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_stored_position_before_the_log_start_moves_to_it() -> None:
    g, reg = guard(Consumer(start=40))
    assert run(g.on_assigned({TP: 10})) == {TP: 40}
    assert run(g.on_assigned({TP: 55})) == {TP: 55}
    assert resets(reg, "before_start") == 1


def test_a_wiped_partition_is_read_again_from_its_start_once_confirmed(caplog: Any) -> None:
    consumer, clock = Consumer(end=0, high=0), Clock()
    g, reg = guard(consumer, clock)
    assert run(g.after_fetch({TP: 500})) == {}  # seen once: may be a leader change
    clock.t = 0.5
    assert run(g.after_fetch({TP: 500})) == {}
    clock.t = 1.2
    assert run(g.after_fetch({TP: 500})) == {TP: 0}
    assert consumer.seeks == [(TP, 0)] and resets(reg, "beyond_end") == 1
    assert "t-node-metrics[3] was 500" in caplog.text and "reset to its start 0" in caplog.text


def test_a_watermark_dip_that_recovers_resets_nothing() -> None:
    consumer, clock = Consumer(end=600, high=450), Clock()
    g, reg = guard(consumer, clock)
    run(g.after_fetch({TP: 500}))
    consumer.high = 520  # the new leader caught up
    clock.t = 2.0
    assert run(g.after_fetch({TP: 500})) == {}
    consumer.high, clock.t = 450, 4.0
    run(g.after_fetch({TP: 500}))
    clock.t = 5.5  # still below, but the broker's end offset says the position is fine
    assert run(g.after_fetch({TP: 500})) == {} and consumer.seeks == []
    assert resets(reg, "beyond_end") == 0


def test_the_broker_s_out_of_range_resets_to_the_start() -> None:
    consumer = Consumer(start=7)
    g, reg = guard(consumer)
    assert run(g.out_of_range({TP: 3})) == {TP: 7}
    assert consumer.seeks == [(TP, 7)] and g.next_offsets[TP] == 7 and resets(reg, "before_start") == 1


class GroupConsumer(Consumer):
    """A group consumer: the group's committed offset (None: the group has none), read by ``committed``."""

    def __init__(self, committed: int | None, **kw: Any) -> None:
        super().__init__(**kw)
        self.committed_offset = committed

    async def committed(self, tp: TopicPartition) -> int | None:
        return self.committed_offset


def test_a_group_s_committed_offset_is_checked_on_assignment(caplog: Any) -> None:
    cases = [  # committed, (start, end) -> position, reset reason
        (None, (5, 50), 5, None),  # a new group: from the start, no reset
        (30, (5, 50), 30, None),
        (50, (5, 50), 50, None),  # at the end: nothing new yet
        (2, (5, 50), 5, "before_start"),  # retention deleted what it points at
        (100, (0, 3), 100, None),  # beyond what ListOffsets says: the first fetch decides (next test)
    ]
    for committed, (start, end), position, reason in cases:
        consumer = GroupConsumer(committed, start=start, end=end)
        g, reg = guard(consumer)
        g.confirm_s = 0.0
        assert run(g.check_committed([TP])) == ({TP: position}, [TP] if reason else [])
        assert consumer.seeks == [(TP, position)] and g.next_offsets[TP] == position
        counted = {r: resets(reg, r) for r in ("before_start", "beyond_end")}
        assert counted == {r: float(r == reason) for r in counted}, (committed, counted)
    assert "was 2, before the partition's start: reset to its start 5" in caplog.text


def test_a_committed_offset_beyond_the_end_is_reset_by_the_fetch_that_finds_it_so(caplog: Any) -> None:
    """The topic was recreated, the group's offsets kept: the fetch's high watermark (0) is below the committed
    offset, so after ``confirm_s`` the partition is read from its start; one where the fetch finds the end at
    the committed offset (ListOffsets said less) is kept."""
    clock = Clock()
    consumer = GroupConsumer(100, start=0, end=0, high=0)
    g, reg = guard(consumer, clock)
    assert run(g.check_committed([TP])) == ({TP: 100}, [])
    assert run(g.after_fetch()) == {}
    clock.t = 1.5
    assert run(g.after_fetch()) == {TP: 0} and resets(reg, "beyond_end") == 1
    assert "t-node-metrics[3] was 100, beyond the partition's end: reset to its start 0" in caplog.text
    kept = GroupConsumer(5, start=0, end=1, high=5)  # the last batch held offsets 0..4; ListOffsets said 1
    g, reg = guard(kept, clock)
    assert run(g.check_committed([TP])) == ({TP: 5}, [])
    clock.t = 9.0
    assert run(g.after_fetch()) == {} and kept.seeks == [(TP, 5)] and resets(reg, "beyond_end") == 0


def test_a_partition_no_check_saw_is_checked_from_the_consumer_s_position_once_fetched(caplog: Any) -> None:
    """The group's committed offsets could not be checked at assignment (the broker was away): the partition is
    read from its committed offset, 100, beyond a wiped partition's end, and the broker answers with nothing.
    Its position is taken from the consumer once a fetch has answered, and reset after ``confirm_s``."""
    consumer, clock = Consumer(end=0, high=None), Clock()
    consumer.at = 100
    g, reg = guard(consumer, clock)
    assert run(g.after_fetch()) == {} and TP not in g.next_offsets  # nothing fetched yet: nothing known
    consumer.high = 0
    assert run(g.after_fetch()) == {} and g.next_offsets[TP] == 100
    clock.t = 1.5
    assert run(g.after_fetch()) == {TP: 0} and resets(reg, "beyond_end") == 1
