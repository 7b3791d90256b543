"""The extender's rtt-predictions sink when the producer gives up, against the real embedded broker: every record
handed to the sink ends published (and on the topic) or counted dropped, and close() stays within the pod's stop
budget while the broker is away.

A batch the producer fails before sending it (its partition without a leader past the request timeout) used to
go on taking records, lost without a count; close() with the broker away used to wait the request timeout (40 s).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from aiokafka import AIOKafkaConsumer

from app.config import Settings
from app.extender.kafka_sink import CLOSE_S, STOP_S, KafkaSink
from app.extender.metrics import ExtenderMetrics
from app.kafka.admin import ensure_topics
from app.kafka.embedded import EmbeddedBroker

pytestmark = pytest.mark.integration

NODES = [f"out-node-{i}".encode() for i in range(6)]


def counts(metrics: ExtenderMetrics) -> tuple[int, int]:
    return int(metrics.published._value.get()), int(metrics.dropped._value.get())


async def on_topic(settings: Settings) -> int:
    consumer = AIOKafkaConsumer(settings.topic("rtt-predictions"), bootstrap_servers=settings.bootstrap_servers,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        n, quiet = 0, time.monotonic() + 2
        while time.monotonic() < quiet:
            got = sum(len(m) for m in (await consumer.getmany(timeout_ms=200)).values())
            n += got
            if got:
                quiet = time.monotonic() + 2
        return n
    finally:
        await consumer.stop()


async def expire_one_batch(settings: Settings) -> tuple[int, ExtenderMetrics]:
    metrics = ExtenderMetrics()
    sink = KafkaSink(settings, metrics)
    await sink.start()
    producer = sink._producer
    producer._message_accumulator._batch_ttl = 0.5  # the request timeout, shorter
    cluster = producer.client.cluster
    leader = cluster.leader_for_partition
    cluster.leader_for_partition = lambda tp: -1  # the partition's leader unknown (an election)
    await sink.send_many([(b"node-x", b"%06d" % i) for i in range(10)])
    await asyncio.sleep(1.0)  # handed over, then failed unsent by the producer
    cluster.leader_for_partition = leader
    for k in range(5):
        await sink.send_many([(b"node-x", b"late%03d" % (k * 10 + i)) for i in range(10)])
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)
    await sink.close()
    return 60, metrics


def test_records_after_a_batch_failed_unsent_are_delivered_or_counted(kafka_settings: Settings) -> None:
    sent, metrics = asyncio.run(expire_one_batch(kafka_settings))
    published, dropped = counts(metrics)
    assert dropped >= 10
    assert published + dropped == sent, f"{sent - published - dropped} records neither published nor dropped"
    assert asyncio.run(on_topic(kafka_settings)) == published


async def close_while_away(settings: Settings, broker: EmbeddedBroker) -> tuple[float, int, ExtenderMetrics]:
    metrics = ExtenderMetrics()
    sink = KafkaSink(settings, metrics)
    await sink.start()
    sent = 0
    for i in range(5):
        await sink.send_many([(node, b"v%d" % i) for node in NODES])
        sent += len(NODES)
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    broker.kill()
    for i in range(20):
        await sink.send_many([(node, b"w%d" % i) for node in NODES])
        sent += len(NODES)
        await asyncio.sleep(0.05)
    t0 = time.monotonic()
    await asyncio.wait_for(sink.close(), 60)
    return time.monotonic() - t0, sent, metrics


def test_close_with_the_broker_away_is_bounded_and_counts_what_it_left(
        settings_factory: Callable[..., Settings]) -> None:
    broker = EmbeddedBroker().start()
    try:
        settings = settings_factory(kafka_bootstrap=broker.bootstrap)
        asyncio.run(ensure_topics(settings))
        took, sent, metrics = asyncio.run(close_while_away(settings, broker))
    finally:
        broker.stop()
    published, dropped = counts(metrics)
    assert took < CLOSE_S + STOP_S + 1, f"close took {took:.1f} s with the broker away"
    assert published >= 5 * len(NODES) and dropped > 0
    assert published + dropped == sent
