"""The trainer's dead-letter marks on the real broker and redis-server: a bad message is dead-lettered once
however often it is read, and a bad message with the same bytes at the same offset of a recreated topic (the
broker lost its data) is dead-lettered as the new message it is; every mark expires, and a mark the earlier
release stored (named without the timestamp) is recognised and given an expiry."""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any

import pytest
import redis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from fault_stack import recreate_topic

from app.clock import ManualClock
from app.config import Settings
from app.contracts import decode
from app.errors import ContractError
from app.registry.store import registry_namespace
from app.trainer.dead_letters import TrainerDeadLetters, mark_name
from app.trainer.metrics import TrainerMetrics

pytestmark = pytest.mark.integration

BAD = b'{"model_key": "gCTF:gpu", "version": "one"}'


async def read_all(s: Settings, topic: str) -> list[Any]:
    c = AIOKafkaConsumer(s.topic(topic), bootstrap_servers=s.bootstrap_servers, auto_offset_reset="earliest",
                         enable_auto_commit=False)
    await c.start()
    try:
        out: list[Any] = []
        for _ in range(20):
            batch = await c.getmany(timeout_ms=250)
            out.extend(m for msgs in batch.values() for m in msgs)
            if out and not batch:
                break
        return sorted(out, key=lambda m: (m.partition, m.offset))
    finally:
        await c.stop()


async def test_a_recreated_topics_bad_message_with_the_same_bytes_is_dead_lettered(kafka_settings: Settings,
                                                                                  redis_url: str) -> None:
    s = dataclasses.replace(kafka_settings, redis_url=redis_url)
    producer = AIOKafkaProducer(bootstrap_servers=s.bootstrap_servers)
    await producer.start()
    dead = TrainerDeadLetters(s, TrainerMetrics(), ManualClock(100.0), producer=producer)
    try:
        await producer.send_and_wait(s.topic("model-updates"), BAD, key=b"gCTF:gpu")
        [first] = await read_all(s, "model-updates")
        assert await dead.send("model-updates", [(first, ContractError("schema", "version: not an integer"))]) == 1
        [again] = await read_all(s, "model-updates")  # a restarted trainer reads it again
        assert await dead.send("model-updates", [(again, ContractError("schema", "version: not an integer"))]) == 0

        await recreate_topic(s, "model-updates")  # as after the broker lost its data
        await producer.send_and_wait(s.topic("model-updates"), BAD, key=b"gCTF:gpu")
        [new] = await read_all(s, "model-updates")
        assert (new.partition, new.offset, new.value) == (first.partition, first.offset, first.value)
        assert await dead.send("model-updates", [(new, ContractError("schema", "version: not an integer"))]) == 1
        letters = [decode("dead-letters", m.value, strict=True) for m in await read_all(s, "dead-letters")]
        assert [(d["topic"], d["offset"]) for d in letters] == [(s.topic("model-updates"), first.offset)] * 2

        client = redis.Redis.from_url(redis_url)
        try:
            names = client.keys(f"{registry_namespace(s.topic_prefix)}:dead-letters:*")
            assert len(names) == 2
            assert all(0 < client.pttl(n) <= 14 * 86400 * 1000 for n in names)  # no mark is kept for ever
        finally:
            client.close()
    finally:
        await dead.close()
        await producer.stop()


async def test_a_mark_the_earlier_release_stored_is_recognised_and_expires(kafka_settings: Settings,
                                                                          redis_url: str) -> None:
    s = dataclasses.replace(kafka_settings, redis_url=redis_url)
    producer = AIOKafkaProducer(bootstrap_servers=s.bootstrap_servers)
    await producer.start()
    dead = TrainerDeadLetters(s, TrainerMetrics(), ManualClock(100.0), producer=producer)
    client = redis.Redis.from_url(redis_url)
    prefix = f"{registry_namespace(s.topic_prefix)}:dead-letters:"
    try:
        await producer.send_and_wait(s.topic("model-updates"), BAD, key=b"gCTF:gpu")
        [rec] = await read_all(s, "model-updates")
        earlier = prefix + f"{rec.topic}.{rec.partition}.{rec.offset}.{zlib.crc32(rec.value):08x}"  # no timestamp
        client.set(earlier, b"1")  # as the earlier release stored a model-updates mark: no expiry
        assert await dead.send("model-updates", [(rec, ContractError("schema", "version: not an integer"))]) == 0
        assert await read_all(s, "dead-letters") == []
        assert not client.exists(earlier)
        assert 0 < client.pttl(prefix + mark_name(rec)) <= 14 * 86400 * 1000  # the record's mark, expiring
        assert await dead.send("model-updates", [(rec, ContractError("schema", "version: not an integer"))]) == 0
    finally:
        client.close()
        await dead.close()
        await producer.stop()
