"""Where the view feed reads task-completions from after a reconnect: on from the position it had applied to (even
when the pass that applied a batch failed after it), and a partition new since the last connection from its start."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError

from app.config import Settings
from app.extender.feed import ViewFeed
from app.extender.metrics import ExtenderMetrics
from app.kafka.positions import PositionGuard
from app.scheduler.builder import SnapshotBuilder

S = Settings.from_env({}, topic_prefix="u-")
P0, P1 = TopicPartition(S.topic("task-completions"), 0), TopicPartition(S.topic("task-completions"), 1)


class Partitions:
    """A consumer's seeks over partitions with the given ends (all starting at 0); ``batches`` are what
    ``getmany`` hands over, one per call, and ``position`` fails with ``lost`` once it is set."""

    def __init__(self, ends: dict[TopicPartition, int], batches: list[dict[TopicPartition, list[Any]]] = ()) -> None:
        self.ends, self.pos = ends, dict[TopicPartition, int]()
        self.batches = list(batches)
        self.lost: BaseException | None = None

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: 0 for tp in tps}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.pos[tp] = offset

    async def seek_to_end(self, *tps: TopicPartition) -> None:
        for tp in tps:
            self.pos[tp] = self.ends[tp]

    async def position(self, tp: TopicPartition) -> int:
        if self.lost is not None:
            raise self.lost
        return self.pos[tp]

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        if not self.batches:
            await asyncio.Event().wait()
        return self.batches.pop(0)


def completion(task_id: str, offset: int) -> Any:
    value = orjson.dumps({"task_id": task_id, "app": "gCTF", "node": "n1", "submitted_ts": time.time() - 3,
                          "started_ts": time.time() - 2, "finished_ts": time.time(), "rtt_ms": 2000.0,
                          "status": "ok"})
    return type("Msg", (), {"key": b"n1", "value": value, "offset": offset, "timestamp": time.time() * 1000})


def feed_of(done: list[str]) -> ViewFeed:
    return ViewFeed(S, SnapshotBuilder(), None, ExtenderMetrics(), rebuild=lambda force: None,  # type: ignore[arg-type]
                    on_completion=done.append)


async def connect(feed: ViewFeed, consumer: Partitions, tps: list[TopicPartition]) -> None:
    """What a connection does with task-completions: a new consumer, its guard, the seek."""
    feed._consumer = consumer
    feed._guard = PositionGuard(consumer, "extender-view", registry=feed._metrics.registry)
    await feed._seek_completions(tps)


async def test_the_first_connection_reads_from_the_end_a_partition_added_while_away_from_its_start() -> None:
    feed = feed_of([])
    first = Partitions({P0: 10})
    await connect(feed, first, [P0])
    assert first.pos == {P0: 10}  # what finished before the extender started is not its business
    again = Partitions({P0: 12, P1: 5})  # away: the topic got a second partition, 5 completions went to it
    await connect(feed, again, [P0, P1])
    assert again.pos == {P0: 10, P1: 0}


async def test_a_partition_first_seen_on_a_reconnect_before_any_fetch_keeps_its_start() -> None:
    feed = feed_of([])
    await connect(feed, Partitions({P0: 10}), [P0])
    await connect(feed, Partitions({P0: 10, P1: 5}), [P0, P1])
    third = Partitions({P0: 10, P1: 7})  # cut again before anything was read from it
    await connect(feed, third, [P0, P1])
    assert third.pos == {P0: 10, P1: 0}


@pytest.mark.parametrize("fails", ["caught-up check", "after fetch"])
async def test_a_batch_applied_before_the_pass_failed_is_not_applied_again(fails: str) -> None:
    done: list[str] = []
    feed = feed_of(done)
    consumer = Partitions({P0: 3}, batches=[{P0: [completion("t3", 3), completion("t4", 4)]}])
    await connect(feed, consumer, [P0])
    if fails == "caught-up check":  # the broker went away right after the fetch
        feed._behind = {P0: 5}
        consumer.lost = KafkaConnectionError("connection lost")
    else:
        feed.caught_up.set()

        async def wiped() -> None:
            raise KafkaConnectionError("connection lost")

        feed._guard.after_fetch = wiped  # type: ignore[method-assign,union-attr]
    with pytest.raises(KafkaConnectionError):
        await asyncio.wait_for(feed._consume(), 5.0)
    assert done == ["t3", "t4"]
    again = Partitions({P0: 5})
    await connect(feed, again, [P0])  # the reconnect
    assert again.pos == {P0: 5}  # on after t4, not t3 again
    applied = feed._metrics.registry.get_sample_value(
        "rtt_extender_feed_messages_total", {"topic": "task-completions", "result": "applied"})
    assert applied == 2.0
