"""model-updates for operations tooling: the newest version announced per key, read once; one announcement sent.

:func:`read_announced` reads every partition from its start to the end offsets it finds (no consumer group, so
nothing is committed and no running process is disturbed), as the trainer, the workers and the extenders read it;
a tombstone or a value that breaks the contract is skipped (they skip it too). :func:`announce` sends the message
the trainer sends (:func:`app.trainer.registry.announcement`) and waits until the broker has it.

A broker that does not answer, or a topic that does not exist, is :class:`~app.kafka.admin.TopicError` (one line
naming ``RTT_KAFKA_BOOTSTRAP`` or ``RTT_TOPIC_PREFIX``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from app.config import Settings
from app.contracts import contract, decode
from app.contracts.admission import check_key
from app.errors import ContractError
from app.kafka.admin import TopicError, check_reachable
from app.kafka.client import client_options, consumer_options
from app.kafka.quiet import handled_connect
from app.trainer.registry import announcement

log = logging.getLogger(__name__)

TOPIC = "model-updates"
READ_TIMEOUT_S = 30.0  # the longest read of model-updates to its end (a compacted topic: one value per key)


@dataclasses.dataclass(frozen=True)
class Announced:
    """The newest version announced for a key: its version, sha256 and announcement time (unix seconds)."""

    version: int
    sha256: str
    ts: float


def newest(updates: list[Mapping[str, Any]]) -> dict[str, Announced]:
    """The newest version of each key among model-updates values (the highest version, as every reader keeps).

    >>> a = {"model_key": "gCTF:gpu", "version": 3, "sha256": "c" * 64, "ts": 30.0}
    >>> b = {"model_key": "gCTF:gpu", "version": 2, "sha256": "b" * 64, "ts": 40.0}
    >>> newest([a, b])["gCTF:gpu"].version
    3
    """
    out: dict[str, Announced] = {}
    for u in updates:
        key, version = str(u["model_key"]), int(u["version"])
        if key not in out or version >= out[key].version:
            out[key] = Announced(version, str(u["sha256"]), float(u["ts"]))
    return out


async def read_announced(settings: Settings, timeout_s: float = READ_TIMEOUT_S) -> dict[str, Announced]:
    """The newest version announced per model key on model-updates, read from its start to its end offsets."""
    await check_reachable(settings, (TOPIC,))
    topic = settings.topic(TOPIC)
    tps = [TopicPartition(topic, p) for p in range(contract(TOPIC).partitions)]
    consumer = AIOKafkaConsumer(**consumer_options(settings, group_id=None, enable_auto_commit=False,
                                                   auto_offset_reset="earliest"))
    updates: list[Mapping[str, Any]] = []
    try:
        with handled_connect():
            await consumer.start()
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while not all([await consumer.position(tp) >= end[tp] for tp in tps]):
            if time.monotonic() > deadline:
                raise TopicError(f"{topic} not read to its end within {timeout_s:.0f} s on "
                                 f"{settings.bootstrap_servers} (RTT_KAFKA_BOOTSTRAP)")
            for records in (await consumer.getmany(*tps, timeout_ms=200)).values():
                for rec in records:
                    if rec.value is None:  # a tombstone deletes no model
                        continue
                    try:
                        value = decode(TOPIC, rec.value)
                        check_key(TOPIC, rec.key, value)
                    except ContractError as exc:
                        log.info("model-updates %s:%d skipped: %s", rec.topic, rec.offset, exc)
                        continue
                    updates.append(value)
    except KafkaError as exc:
        raise TopicError(f"cannot read {topic} on {settings.bootstrap_servers} (RTT_KAFKA_BOOTSTRAP): "
                         f"{exc}") from None
    finally:
        await consumer.stop()
    return newest(updates)


async def announce(settings: Settings, fields: Mapping[str, Any], timeout_s: float = READ_TIMEOUT_S) -> None:
    """Send the model-updates message of ``fields`` (:func:`app.trainer.registry.update_message`'s) and wait
    until the broker acknowledged it (all in-sync replicas), as the trainer does."""
    key, value = announcement(fields, ts=time.time(), onset_ts=None)
    producer = AIOKafkaProducer(**client_options(settings, acks="all", request_timeout_ms=int(timeout_s * 1000)))
    try:
        with handled_connect():
            await producer.start()
        await asyncio.wait_for(producer.send_and_wait(settings.topic(TOPIC), value, key=key), timeout_s)
    except (KafkaError, TimeoutError) as exc:
        raise TopicError(f"{settings.topic(TOPIC)}: the announcement of {fields['model_key']} "
                         f"v{fields['version']} was not acknowledged by {settings.bootstrap_servers}: "
                         f"{exc!r}") from None
    finally:
        await producer.stop()
