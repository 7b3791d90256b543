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
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from feedbackkit import Reader, prediction, produce, start_worker

from app.cli.processes import ProcessGroup
from app.config import Settings
from app.kafka.batches import partition_for
from app.kafka.client import client_options
from app.streams.feedback_outbox import ErrorsOutbox

pytestmark = pytest.mark.integration

APP = "gCTF"
NODES = [f"gpu-k{i:03d}" for i in range(300)]
WAVES = 12


def wave(k: int, t0: float) -> list[tuple[str, dict[str, Any]]]:
    """One pair per node: its prediction, then its completion."""
    rng = random.Random(k)
    items: list[tuple[str, dict[str, Any]]] = []
    for n in NODES:
        tid = f"w{k}-{n}"
        rtt = rng.uniform(100.0, 300.0)
        items.append(("rtt-predictions", prediction(tid, APP, n, t0, rtt * 1.1)))
        items.append(("task-completions", {"task_id": tid, "app": APP, "node": n, "submitted_ts": t0 - 0.01,
                                           "started_ts": t0, "finished_ts": t0 + rtt / 1000, "rtt_ms": rtt,
                                           "status": "ok"}))
    return items


def counted(values: list[dict[str, Any]]) -> int:
    return sum(v["apps"][APP]["n"] for v in values if APP in v["apps"])


async def one_life(s: Settings, group: ProcessGroup, name: str, waves: range, t0: float,
                   errors: Reader, kill: bool) -> None:
    start_worker(group, s, name)
    pid = group.children[name].pid
    for k in waves:
        await produce(s, wave(k, t0))
        await asyncio.sleep(0.3)
    if not kill:
        return
    before = len(errors.values)
    # the first message of the next period: kill the worker while that period is being delivered
    while len(errors.values) == before:
        await asyncio.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    group.children.pop(name).wait(10)


def test_sigkill_at_period_close_loses_and_repeats_nothing(kafka_settings: Settings, tmp_path: Path) -> None:
    s = dataclasses.replace(kafka_settings, error_period_s=1.0)
    t0 = time.time()

    async def run() -> list[dict[str, Any]]:
        async with Reader(s, "prediction-errors") as errors:
            errors.poll_ms = 20
            with ProcessGroup(tmp_path) as group:
                await one_life(s, group, "first", range(0, 4), t0, errors, kill=True)
                await one_life(s, group, "second", range(4, 8), t0, errors, kill=True)
                await one_life(s, group, "third", range(8, WAVES), t0, errors, kill=False)
                await errors.wait(lambda v: counted(v) >= WAVES * len(NODES), 60.0, "every pair reported")
                await asyncio.sleep(3 * s.error_period_s)  # a repeat would show up by now
            return list(errors.values)

    values = asyncio.run(run())
    idents = [(v["node"], v["ts"]) for v in values]
    assert len(idents) == len(set(idents)), "a prediction-errors message was sent twice"
    assert counted(values) == WAVES * len(NODES)
    per_node = {n: 0 for n in NODES}
    for v in values:
        per_node[v["node"]] += v["apps"][APP]["n"]
    assert set(per_node.values()) == {WAVES}


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
