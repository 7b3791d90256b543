"""The extender's rtt-predictions sink against the real embedded broker answering every produce request 60 ms
late: 144 records/s over 6 nodes for 8 s are all delivered, in order per partition, each within a second.

One batch per partition per produce round trip used to be all the sink shipped: at this rate its batches
queued without end (delays of seconds, then ``send_batch`` timeouts and dropped predictions).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.client import AIOKafkaClient
from bench_sink_backlog import AckTimer

from app.config import Settings
from app.extender.kafka_sink import KafkaSink
from app.extender.metrics import ExtenderMetrics
from app.kafka.batches import partition_for

pytestmark = pytest.mark.integration

DELAY_S = 0.06  # added to every produce round trip
NODES = [f"slow-node-{i}".encode() for i in range(6)]
RATE_HZ = 24  # requests per second, one record per node each: 144 records/s
SECONDS = 8.0
MAX_LATENCY_S = 1.0  # about 3 round trips here; the sink that fell behind passed 2 s and dropped


async def read_back(settings: Settings, topic: str, n: int) -> list[Any]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=settings.bootstrap_servers, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        out: list[Any] = []
        deadline = time.monotonic() + 20
        while len(out) < n and time.monotonic() < deadline:
            for msgs in (await consumer.getmany(timeout_ms=500)).values():
                out.extend(msgs)
        return out
    finally:
        await consumer.stop()


async def run_slow(settings: Settings) -> tuple[ExtenderMetrics, list[float], int, int]:
    metrics = ExtenderMetrics()
    sink = KafkaSink(settings, metrics)
    await sink.start()
    partitions = sink._partitions
    timer = AckTimer(sink)
    sent_at, acked, latencies = timer.sent_at, timer.acked, timer.latencies
    sent = 0
    try:
        start = next_at = time.monotonic()
        seq = 0
        while time.monotonic() - start < SECONDS:
            now = time.monotonic()
            records = []
            for node in NODES:
                sent_at[partition_for(node, partitions)].append(now)
                records.append((node, orjson.dumps({"node": node.decode(), "seq": seq})))
            seq += 1
            await sink.send_many(records)
            sent += len(records)
            next_at += 1 / RATE_HZ
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        deadline = time.monotonic() + 3
        while sum(acked.values()) + metrics.dropped._value.get() < sent and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        in_flight = sent - sum(acked.values())
    finally:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(sink.close(), 10)
    return metrics, latencies, sent, in_flight


def test_a_slow_broker_gets_every_prediction_within_a_few_round_trips(
        kafka_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    send = AIOKafkaClient.send

    async def slow_send(self: AIOKafkaClient, node_id: int, request: Any, *args: Any, **kwargs: Any) -> Any:
        response = await send(self, node_id, request, *args, **kwargs)
        if type(request).__name__.startswith("ProduceRequest"):
            await asyncio.sleep(DELAY_S)
        return response

    monkeypatch.setattr(AIOKafkaClient, "send", slow_send)
    metrics, latencies, sent, in_flight = asyncio.run(run_slow(kafka_settings))
    assert metrics.dropped._value.get() == 0
    assert in_flight == 0, f"{in_flight} of {sent} records not acknowledged 3 s after the last was sent"
    assert len(latencies) == sent
    assert max(latencies) < MAX_LATENCY_S, f"slowest delivery {max(latencies):.2f}s"
    assert metrics.published._value.get() == sent

    topic = kafka_settings.topic("rtt-predictions")
    read = asyncio.run(read_back(kafka_settings, topic, sent))
    seqs: dict[str, list[int]] = defaultdict(list)
    for msg in read:
        value = orjson.loads(msg.value)
        seqs[value["node"]].append(value["seq"])
    assert {node: s for node, s in seqs.items()} == {n.decode(): list(range(sent // len(NODES))) for n in NODES}
