"""prediction-errors across SIGKILLs right at period close: every pair in exactly one message.

A worker subprocess joins a steady stream of pairs on 300 nodes (one error period closes 300 messages).
Twice, the moment the first prediction-errors message of a period reaches the test, the worker is killed
with SIGKILL — while the rest of that period is being sent — and a new one started; the third runs until
every pair is reported. The sum of ``n`` over all messages must equal the pairs produced, and no
``(node, ts)`` may appear twice. The outbox's two restart cases are also checked one by one against the
broker (:class:`~app.streams.feedback_outbox.ErrorsOutbox`): a staged message never sent is sent; one
acknowledged but not cleared is found in the topic and not sent again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from fault_stack import APP, recreate_topic
from fault_worker import KILL_NODES, period_kill

from app.config import Settings
from app.kafka.admin import ensure_topics
from app.kafka.batches import partition_for
from app.kafka.client import client_options
from app.kafka.embedded import EmbeddedBroker
from app.retry import Backoff
from app.sim.scripted import Reader
from app.streams.feedback_outbox import ErrorsOutbox

pytestmark = pytest.mark.integration



def test_sigkill_at_period_close_loses_and_repeats_nothing(kafka_settings: Settings, tmp_path: Path) -> None:
    s = dataclasses.replace(kafka_settings, error_period_s=1.0)
    outcome, values = asyncio.run(period_kill(s, tmp_path))
    assert outcome.dead == 0
    assert (outcome.lost, outcome.twice) == (0, 0), outcome
    per_node = {n: 0 for n in KILL_NODES}
    for v in values:
        per_node[v["node"]] += v["apps"][APP]["n"]
    assert set(per_node.values()) == {12}


async def _stage_and_write(outbox: ErrorsOutbox, node: str, ts: float) -> tuple[bytes, bytes]:
    partition = partition_for(node.encode(), outbox.partitions)
    await outbox.prepare({partition})
    outbox.stage(partition, {"node": node, "ts": ts, "period_s": 1.0, "apps": {APP: {"n": 3}}})
    rows = outbox.take_rows()
    outbox.written(rows)  # as after a checkpoint that stored them
    key, raw = rows[0]
    assert raw is not None
    return key, raw


def test_outbox_restart_cases_against_the_broker(kafka_settings: Settings) -> None:
    s = kafka_settings

    async def run() -> tuple[int, int, list[dict[str, Any]]]:
        producer = AIOKafkaProducer(**client_options(s))
        await producer.start()

        async def send(key: bytes, value: bytes) -> Any:
            return await producer.send(s.topic("prediction-errors"), value, key=key)

        try:
            async with Reader(s, "prediction-errors") as errors:
                # case 1: staged and durable, killed before sending
                first = ErrorsOutbox(s, send)
                key1, raw1 = await _stage_and_write(first, "gpu-x1", 1000.0)
                # case 2: sent and acknowledged, killed before the tombstone
                second = ErrorsOutbox(s, send)
                key2, raw2 = await _stage_and_write(second, "gpu-x2", 2000.0)
                assert await second.deliver() == 1
                await errors.wait(lambda v: len(v) >= 1, 10.0, "the delivered message")

                restarted = ErrorsOutbox(s, send)
                for key, raw in ((key1, raw1), (key2, raw2)):
                    restarted.restore(int(key.split(b"|")[0]), key, raw)
                assert await restarted.deliver() == 0  # nothing goes out before the topic was checked
                partitions = {int(k.split(b"|")[0]) for k in (key1, key2)}
                cleared = await restarted.reconcile(partitions)
                sent = await restarted.deliver()
                await errors.wait(lambda v: len(v) >= 2, 10.0, "the restored message")
                await asyncio.sleep(1.0)
                tombstones = [k for k, v in restarted.take_rows() if v is None]
                assert sorted(tombstones) == sorted([key1, key2])
                return cleared, sent, list(errors.values)
        finally:
            await producer.stop()

    cleared, sent, values = asyncio.run(run())
    assert (cleared, sent) == (1, 1)
    assert sorted((v["node"], v["ts"]) for v in values) == [("gpu-x1", 1000.0), ("gpu-x2", 2000.0)]


def test_outbox_finds_a_message_sent_after_its_topic_was_recreated(kafka_settings: Settings) -> None:
    """The broker lost its data and prediction-errors was recreated: a message staged before the first one
    acknowledged there carries the old partition's end as its floor. Once the new partition grows past
    that floor, a restored row of that delivered message must still be found, not sent again."""
    s = kafka_settings
    node = "gpu-z1"

    async def run() -> tuple[int, int, int]:
        producer = AIOKafkaProducer(**client_options(s))
        await producer.start()

        async def send(key: bytes, value: bytes) -> Any:
            return await producer.send(s.topic("prediction-errors"), value, key=key)

        try:
            outbox = ErrorsOutbox(s, send)
            now = time.time()
            for i in range(6):  # the old partition: floor 6
                await _stage_and_write(outbox, node, now - 60 + i)
                assert await outbox.deliver() == 1
            await recreate_topic(s, "prediction-errors")
            key, raw = await _stage_and_write(outbox, node, now)
            assert await outbox.deliver() == 1  # offset 0 of the new partition, its row says floor 6
            for i in range(8):  # later periods: the new partition now ends past 6
                await _stage_and_write(outbox, node, now + 1 + i)
                assert await outbox.deliver() == 1
            restarted = ErrorsOutbox(s, send)
            restarted.restore(int(key.split(b"|")[0]), key, raw)
            cleared = await restarted.reconcile({int(key.split(b"|")[0])})
            return json.loads(raw)["floor"], cleared, await restarted.deliver()
        finally:
            await producer.stop()

    floor, cleared, sent = asyncio.run(run())
    assert floor == 6  # the case at hand: a floor from before the topic was recreated
    assert (cleared, sent) == (1, 0)


def test_outbox_reconcile_tried_again_until_the_broker_answers(settings_factory: Any) -> None:
    """A restarted worker finds its broker away when it looks for its restored messages: looking fails, and is
    tried again until the broker answers; then the never-sent message is sent. (A worker that gave up after
    one failure kept the message, and its pairs, out of the topic for good.)"""
    broker = EmbeddedBroker().start()
    s = settings_factory(kafka_bootstrap=broker.bootstrap)

    async def run() -> tuple[list[tuple[int, str]], int, int, list[dict[str, Any]]]:
        await ensure_topics(s)
        key, raw = await _stage_and_write(ErrorsOutbox(s), "gpu-r1", 3000.0)  # durable, never sent
        partition = int(key.split(b"|")[0])
        broker.kill()
        restarted = ErrorsOutbox(s)
        restarted.restore(partition, key, raw)
        failures: list[tuple[int, str]] = []
        task = asyncio.get_running_loop().create_task(restarted.reconcile_until_done(
            lambda: {partition}, Backoff(first_s=0.2, max_s=0.5, jitter=0.0),
            on_failure=lambda tries, exc: failures.append((tries, type(exc).__name__)), timeout_s=5.0))
        deadline = time.monotonic() + 30.0  # a try with the broker away fails at once, or after timeout_s (5 s)
        while not failures and not task.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert failures, f"no failed try with the broker away after 30 s (reconcile ended: {task.done()})"
        assert not task.done() and restarted.unchecked() == 1
        await asyncio.to_thread(broker.start)  # in memory: the topics are gone with the old process
        await ensure_topics(s)
        cleared = await asyncio.wait_for(task, 60.0)
        producer = AIOKafkaProducer(**client_options(s))
        await producer.start()

        async def send(key: bytes, value: bytes) -> Any:
            return await producer.send(s.topic("prediction-errors"), value, key=key)

        try:
            restarted.send = send
            async with Reader(s, "prediction-errors") as errors:
                sent = await restarted.deliver()
                await errors.wait(lambda v: len(v) >= 1, 10.0, "the restored message")
                return failures, cleared, sent, list(errors.values)
        finally:
            await producer.stop()

    try:
        failures, cleared, sent, values = asyncio.run(run())
    finally:
        broker.stop()
    assert failures and [t for t, _ in failures] == list(range(1, len(failures) + 1))
    assert (cleared, sent) == (0, 1)
    assert [(v["node"], v["ts"], v["apps"][APP]["n"]) for v in values] == [("gpu-r1", 3000.0, 3)]
