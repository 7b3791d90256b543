"""A group's committed offsets checked on the real broker: a group that had read everything is not sent back to
the partition's start, whatever the broker's ListOffsets answer says of the end."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from prometheus_client import CollectorRegistry

from app.kafka.positions import PositionGuard

pytestmark = pytest.mark.integration


async def _read(consumer: AIOKafkaConsumer, guard: PositionGuard, rounds: int) -> list[int]:
    """``rounds`` fetches, each checked as the services check theirs; the offsets read."""
    offsets: list[int] = []
    for _ in range(rounds):
        batches = await consumer.getmany(timeout_ms=200)
        guard.note(batches)
        await guard.after_fetch()
        offsets += [r.offset for records in batches.values() for r in records]
    return offsets


async def test_a_group_at_the_end_of_a_partition_whose_last_batch_holds_several_records_reads_on(
        kafka_bootstrap: str) -> None:
    topic, group = f"positions-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=200)
    await producer.start()
    try:  # five records in one batch
        await asyncio.gather(*[await producer.send(topic, f"r{i}".encode(), partition=0) for i in range(5)])
    finally:
        await producer.stop()

    first = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=group, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_wait_ms=50)
    await first.start()
    try:
        first.assign([tp])
        read: list[int] = []
        while len(read) < 5:
            read += [r.offset for r in (await first.getmany(timeout_ms=500)).get(tp, [])]
        await first.commit({tp: 5})
    finally:
        await first.stop()
    assert read == [0, 1, 2, 3, 4]

    again = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=group, enable_auto_commit=False,
                             auto_offset_reset="none", fetch_max_wait_ms=50)
    await again.start()
    registry = CollectorRegistry()
    guard = PositionGuard(again, "test-group", registry=registry, confirm_s=0.3)
    try:
        again.assign([tp])
        assert await guard.check_committed([tp]) == ({tp: 5}, [])
        assert await _read(again, guard, rounds=6) == []  # nothing read twice, across more than confirm_s
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"r5", partition=0)
        finally:
            await producer.stop()
        assert await _read(again, guard, rounds=4) == [5]
    finally:
        await again.stop()
    assert guard.resets == 0
    assert not registry.get_sample_value("rtt_kafka_position_resets_total",
                                         {"client": "test-group", "topic": topic, "reason": "beyond_end"})
