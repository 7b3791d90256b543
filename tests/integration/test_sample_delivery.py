"""A training sample the broker does not take is sent again, and the join's read positions wait for it.

The feedback join's samples go out on its intake's record batches without waiting for the broker. A batch
that failed — the broker away past the producer's request timeout — used to be forgotten: the next
checkpoint raised its stale error, the one after wrote the join's read positions past the completion, and
the sample was nowhere (counted as sent all the same). Here the broker is SIGKILLed (memory-only Tansu),
a completion makes its sample while it is away, the producer gives up on it, the broker comes back empty
with its topics recreated, and checkpoints run: the sample is in training-samples, counted once, and the
positions are stored.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from app.config import Settings
from app.contracts import contract, decode, encode
from app.kafka.admin import ensure_topics
from app.kafka.embedded import EmbeddedBroker
from app.sim.scripted import Node, prediction, task
from app.streams.app import create_app, worker_topics
from app.streams.context import context_of
from app.streams.feedback_state import FeedbackLoop
from app.streams.options import WorkerOptions

pytestmark = pytest.mark.integration

NODE = Node("gpu-1", "Tesla M40", 150.0, util=40.0)
REQUEST_TIMEOUT_MS = 1_000


async def read_topic(s: Settings, topic: str, partitions: int) -> list[tuple[bytes | None, bytes | None]]:
    """Every record of ``topic`` (all its ``partitions``, from the start)."""
    c = AIOKafkaConsumer(bootstrap_servers=s.bootstrap_servers, group_id=None, auto_offset_reset="earliest",
                         enable_auto_commit=False)
    await c.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        ends = await c.end_offsets(tps)
        out: list[tuple[bytes | None, bytes | None]] = []
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            for records in (await c.getmany(timeout_ms=200)).values():
                out += [(r.key, r.value) for r in records]
            if all([await c.position(tp) >= end for tp, end in ends.items()]):
                return out
        raise AssertionError(f"{topic} not read to its end {ends} within 10 s")
    finally:
        await c.stop()


def feed(loop: FeedbackLoop, task_id: str, ts: float) -> None:
    """A prediction naming the node's model key (so its class is known), then the task's completion: one
    matched pair and one training sample, as the join's intake hands them to its handlers."""
    handlers = loop.intake.handlers  # type: ignore[union-attr]
    p = {**prediction(task_id, "gCTF", NODE.name, ts, 300.0), "model_key": "gCTF:gpu"}
    handlers["rtt-predictions"](decode("rtt-predictions", encode("rtt-predictions", p)), 0)
    c = task(task_id, "gCTF", NODE, ts, random.Random(task_id))
    handlers["task-completions"](decode("task-completions", encode("task-completions", c)), 0)


async def checkpoint_until_stored(loop: FeedbackLoop, tries: int = 20) -> int:
    """Checkpoint as the worker's timer does (a failed tick is retried next tick); how many ticks failed."""
    for failed in range(tries):
        try:
            await loop.checkpoint()
            return failed
        except KafkaError:
            await asyncio.sleep(0.3)
    raise AssertionError(f"no checkpoint stored in {tries} ticks")


async def scenario(s: Settings, broker: EmbeddedBroker, tmp_path: Path) -> dict[str, Any]:
    app_id = f"{s.topic_prefix}worker"
    await ensure_topics(s, worker_topics(s, app_id))
    options = dataclasses.replace(WorkerOptions.from_settings(s), datadir=str(tmp_path / "faust"),
                                  request_timeout_ms=REQUEST_TIMEOUT_MS)
    app = create_app(s, id=app_id, options=options)
    ctx = context_of(app)
    loop: FeedbackLoop = ctx.handles["feedback"]
    intake = loop.intake
    assert intake is not None
    value: Callable[..., float] = ctx.metrics.value
    completions = TopicPartition(s.topic("task-completions"), 0)
    await intake.start()
    try:
        t0 = time.time()
        feed(loop, "before", t0)  # the broker up: the sample goes, the checkpoint stores the positions
        intake.positions[completions] = 1
        await intake.sender.ship()  # type: ignore[union-attr]
        await checkpoint_until_stored(loop)
        before = value("rtt_worker_training_samples_total")

        broker.kill()
        feed(loop, "away", t0 + 1.0)  # made while the broker is away ...
        intake.positions[completions] = 2
        await intake.sender.ship()  # type: ignore[union-attr]  # ... shipped as the intake does after a batch
        deadline = time.monotonic() + 10.0
        while not value("rtt_worker_send_failures_total", topic="training-samples", outcome="retried"):
            assert time.monotonic() < deadline, "the producer never gave up on the sample"
            await asyncio.sleep(0.1)  # until the producer gives up on it (its request timeout)
        away = {"samples": value("rtt_worker_training_samples_total"),
                "retried": value("rtt_worker_send_failures_total", topic="training-samples", outcome="retried")}

        await asyncio.to_thread(broker.start)  # back, empty: the topics are created again
        await ensure_topics(s, worker_topics(s, app_id), recreate=True)
        failed_ticks = await checkpoint_until_stored(loop)
        after = {"samples": value("rtt_worker_training_samples_total"),
                 "out": value("rtt_worker_messages_out_total", topic="training-samples")}
    finally:
        await intake.stop()
    samples = [decode("training-samples", v, strict=True)
               for _, v in await read_topic(s, s.topic("training-samples"), contract("training-samples").partitions)
               if v]
    changelog = dict(await read_topic(s, loop.table.changelog_topic.get_topic_name(),
                                      contract("task-completions").partitions))
    positions = changelog.get(b"0|o|")
    return {"before": before, "away": away, "after": after, "failed_ticks": failed_ticks,
            "tasks": [x["task_id"] for x in samples],
            "positions": orjson.loads(positions) if positions else None}


def test_a_sample_sent_while_the_broker_is_away_is_delivered_before_the_positions_move(
        settings_factory: Callable[..., Settings], tmp_path: Path) -> None:
    broker = EmbeddedBroker().start()
    try:
        s = settings_factory(kafka_bootstrap=broker.bootstrap)
        r = asyncio.run(scenario(s, broker, tmp_path))
    finally:
        broker.stop()
    assert r["before"] == 1.0
    # while the broker is away the sample is not counted as sent; its failed delivery is, as retried
    assert r["away"] == {"samples": 1.0, "retried": 1.0}, r
    # the broker came back empty: the sample made while it was away is there (at least once), and the
    # read positions stored with it cover its completion
    assert "away" in r["tasks"], r
    assert r["positions"] == {"task-completions": 2}, r
    # counted once, when the broker took it
    assert r["after"] == {"samples": 2.0, "out": 2.0}, r
