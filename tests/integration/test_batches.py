"""BatchSender on the embedded broker: records arrive in order, where the default partitioner puts them."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from fault_stack import recreate_topic

from app.config import Settings
from app.kafka.admin import ensure_topics
from app.kafka.batches import BatchSender, partition_for

pytestmark = pytest.mark.integration

TOPIC = "training-samples"


async def read_all(s: Settings, topic: str, partitions: int, n: int) -> list[tuple[int, bytes | None, bytes | None]]:
    c = AIOKafkaConsumer(bootstrap_servers=s.bootstrap_servers, group_id=None, auto_offset_reset="earliest",
                         enable_auto_commit=False)
    await c.start()
    out: list[tuple[int, bytes | None, bytes | None]] = []
    try:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        for _ in range(100):
            batch = await c.getmany(timeout_ms=200)
            for tp, records in batch.items():
                out += [(tp.partition, r.key, r.value) for r in records]
            if len(out) >= n:
                break
    finally:
        await c.stop()
    return out


async def scenario(s: Settings) -> dict[str, object]:
    await ensure_topics(s)
    topic = s.topic(TOPIC)
    producer = AIOKafkaProducer(bootstrap_servers=s.bootstrap_servers, max_batch_size=16 * 1024)
    await producer.start()
    try:
        partitions = sorted(await producer.partitions_for(topic))
        # where aiokafka's own partitioner puts each key
        reference = {}
        for key in (b"gCTF:gpu", b"upload:cpu", b"Motioncor2:gpu"):
            md = await (await producer.send(topic, b"ref", key=key))
            reference[key] = md.partition
        sender = BatchSender(producer)
        sent = []
        for i in range(3000):  # several batches per partition at 16 KiB each
            key = (b"gCTF:gpu", b"upload:cpu", b"Motioncor2:gpu")[i % 3]
            value = f"{i:06d}".encode() + b"x" * 40
            sender.add(topic, partition_for(key, len(partitions)), key, value)
            sent.append((key, value))
        assert len(sender) == 3000
        shipped = await sender.flush()
        assert len(sender) == 0
        sender.add(topic, 0, b"gone", None)  # a tombstone
        await sender.flush()
    finally:
        await producer.stop()
    got = await read_all(s, topic, len(partitions), 3000 + 3 + 1)
    return {"partitions": len(partitions), "reference": reference, "sent": sent, "got": got, "shipped": shipped}


def test_batches_keep_order_and_partitioning(kafka_settings: Settings) -> None:
    r = asyncio.run(scenario(kafka_settings))
    got = [g for g in r["got"] if g[2] != b"ref"]  # type: ignore[attr-defined]
    assert r["shipped"] == 3000
    # the partition of a key is the one aiokafka's default partitioner chose
    for key, partition in r["reference"].items():  # type: ignore[attr-defined]
        assert partition_for(key, r["partitions"]) == partition  # type: ignore[arg-type]
        assert {p for p, k, _ in got if k == key} == {partition}
    # every record once, in the order it was added (per key, hence per partition)
    for key in r["reference"]:  # type: ignore[attr-defined]
        assert [v for _, k, v in got if k == key] == [v for k, v in r["sent"] if k == key]  # type: ignore[attr-defined]
    assert (0, b"gone", None) in got


def test_a_partition_recreated_under_the_sender_is_found_rewound(kafka_settings: Settings) -> None:
    """Batches acknowledged below the end the sender's last batch of that partition left: the topic was
    recreated (a broker that lost its data); the caller is told which partitions, once."""
    s = kafka_settings

    async def run() -> tuple[set[int], set[int], set[int], set[int]]:
        await ensure_topics(s)
        topic = s.topic(TOPIC)
        producer = AIOKafkaProducer(bootstrap_servers=s.bootstrap_servers, max_batch_size=16 * 1024)
        await producer.start()
        try:
            sender = BatchSender(producer)
            for round_ in range(3):  # several batches of one partition per flush, three flushes: nothing rewound
                for i in range(600):
                    sender.add(topic, i % 2, b"k", f"{round_}-{i}".encode() + b"x" * 40)
                await sender.flush()
            quiet = sender.take_rewound(topic)
            await recreate_topic(s, TOPIC)
            sender.add(topic, 1, b"k", b"after")  # partition 1 only
            await sender.flush()
            found, again = sender.take_rewound(topic), sender.take_rewound(topic)
            sender.add(topic, 1, b"k", b"later")
            await sender.flush()
            return quiet, found, again, sender.take_rewound(topic)
        finally:
            await producer.stop()

    quiet, found, again, later = asyncio.run(run())
    assert quiet == set()
    assert found == {1}
    assert again == set() and later == set()  # reported once; the new partition's own growth is not a rewind
