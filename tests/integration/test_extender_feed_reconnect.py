"""The extender's view feed on the real broker: the task-completions produced while its connection is down are
applied once it reconnects (it reads on from where it was, not from the end again), and a position its
partition no longer has (the topic recreated meanwhile) is read again from the partition's start."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from fault_stack import recreate_topic

from app.config import Settings
from app.contracts import encode
from app.extender.feed import ViewFeed
from app.extender.metrics import ExtenderMetrics
from app.scheduler.builder import SnapshotBuilder

pytestmark = pytest.mark.integration


def completion(task_id: str, node: str) -> bytes:
    now = time.time()
    return encode("task-completions", {"task_id": task_id, "app": "gCTF", "node": node, "submitted_ts": now - 3.0,
                                       "started_ts": now - 2.0, "finished_ts": now, "rtt_ms": 2000.0,
                                       "status": "ok"})


async def send(settings: Settings, tasks: list[tuple[str, str]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    await producer.start()
    try:
        for task_id, node in tasks:
            await producer.send_and_wait(settings.topic("task-completions"), completion(task_id, node),
                                         key=node.encode())
    finally:
        await producer.stop()


async def until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def no_model(update: Any) -> Any:
    raise AssertionError("no model is announced in these tests")


def started_feed(settings: Settings) -> tuple[ViewFeed, list[str], ExtenderMetrics]:
    done: list[str] = []
    metrics = ExtenderMetrics()
    feed = ViewFeed(settings, SnapshotBuilder(), no_model, metrics, rebuild=lambda force: None,
                    report_s=1.0, on_completion=done.append)
    feed.start()
    return feed, done, metrics


async def cut_off(feed: ViewFeed) -> asyncio.Event:
    """Stop the feed's consumer (its connection ends, as when the broker goes away) and hold its reconnect until
    the event returned is set; returns once the feed is waiting to reconnect."""
    release, waiting = asyncio.Event(), asyncio.Event()
    connect: Callable[[], Awaitable[None]] = feed._connect  # type: ignore[method-assign]

    async def held() -> None:
        waiting.set()
        await release.wait()
        await connect()

    feed._connect = held  # type: ignore[method-assign]
    await feed._consumer.stop()
    await asyncio.wait_for(waiting.wait(), 10.0)
    return release


async def test_completions_produced_while_the_feed_reconnects_are_applied(kafka_settings: Settings) -> None:
    feed, done, _ = started_feed(kafka_settings)
    try:
        await asyncio.wait_for(feed.caught_up.wait(), 20.0)
        await send(kafka_settings, [("t-before", "gpu-1")])
        await until(lambda: "t-before" in done, 10.0, "the completion before the cut")
        release = await cut_off(feed)
        away = [(f"t-away-{i}", f"gpu-{i % 3}") for i in range(6)]  # several partitions
        await send(kafka_settings, away)
        release.set()
        await send(kafka_settings, [("t-after", "gpu-1")])
        want = {task for task, _ in away} | {"t-after"}
        await until(lambda: want <= set(done), 15.0, f"the completions produced while away (got {done})")
        assert done.count("t-before") == 1 and all(done.count(t) == 1 for t in want)  # nothing read twice
    finally:
        await feed.stop()


async def test_a_completions_topic_recreated_while_away_is_read_from_its_start(kafka_settings: Settings) -> None:
    feed, done, metrics = started_feed(kafka_settings)
    try:
        await asyncio.wait_for(feed.caught_up.wait(), 20.0)
        await send(kafka_settings, [(f"t-old-{i}", "gpu-1") for i in range(4)])
        await until(lambda: len(done) == 4, 10.0, "the completions before the cut")
        release = await cut_off(feed)
        await recreate_topic(kafka_settings, "task-completions")  # gpu-1's partition: position 4, end 0
        await send(kafka_settings, [("t-new", "gpu-1")])  # end 1, still below the old position
        release.set()
        await until(lambda: "t-new" in done, 15.0, f"the completion on the recreated topic (got {done})")
        assert 'rtt_kafka_position_resets_total{client="extender-view",reason="beyond_end",topic="task-completions"}' \
            in metrics.render().decode()
    finally:
        await feed.stop()
