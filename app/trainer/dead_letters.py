"""Messages the trainer reads that break their contract go to dead-letters with the reason, each once.

The trainer reads three topics. A bad **retrain-event** is read once by the trainers' group: it is
dead-lettered, then committed like any event that ended. **training-samples** and **model-updates** are
read from their start by every trainer (and model-updates by every worker and extender, which count and log
a bad one): a restarted trainer reads the same bad message again. It is dead-lettered the first time a
trainer reads it: a mark named by its topic, partition, offset, record timestamp and the CRC-32 of its bytes
is stored once the dead letter is (Redis ``SET`` under the registry's namespace; a file under
``{RTT_MODELS_DIR}/dead-letters`` with the directory registry), and a message whose mark exists is counted
and logged only. The timestamp and the checksum keep a new bad message at an old offset of a recreated topic
(the broker lost its data, the topic was deleted) from being taken for the old one: a record keeps the
timestamp it was written with, a new one has its own, even with the same bytes. A Redis mark expires with the
topic's retention, after which the message is gone; a compacted topic's (model-updates: a bad value stays until
its key has a new one) with the dead-letters topic's, after which its dead letter is gone: a trainer that
reads the value again then dead-letters it again, and no mark outlives its topic for ever. When the marks
cannot be read (Redis away), the message is dead-lettered anyway: a second copy rather than none.

A dead letter Kafka does not acknowledge is sent again with backoff (``RTT_RETRY_MAX_BACKOFF_S`` at most
between tries) until it is stored: a bad retrain-event is committed only then; those of the topics read from
their start are sent in the background while their consumer reads on (their marks, stored once they are,
make a restarted trainer send what this one could not). One the broker refuses for good (the record too
large, the topic invalid or not writable) is logged at ERROR and given up. ``rtt_trainer_dead_letters_total{topic,
reason}`` counts the dead letters stored; ``rtt_trainer_bad_messages_total{topic, reason}`` every bad
message read.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from pathlib import Path
from typing import Any, Protocol

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from redis.exceptions import RedisError

from app.clock import Clock
from app.config import Settings
from app.contracts import contract, encode
from app.contracts.dead import dead_letter_record
from app.errors import ContractError
from app.kafka.batches import permanent
from app.redis_client import settings_redis
from app.registry.store import registry_namespace
from app.retry import Backoff
from app.trainer.metrics import TrainerMetrics

log = logging.getLogger(__name__)


class Marks(Protocol):
    """Names stored once; both calls may raise ``OSError`` or ``RedisError`` (the store away)."""

    async def has(self, name: str) -> bool: ...

    async def add(self, name: str, ttl_s: float | None) -> None: ...

    async def close(self) -> None: ...


class RedisMarks:
    """Marks as Redis keys ``{namespace}:dead-letters:{name}``."""

    def __init__(self, settings: Settings) -> None:
        self.client = settings_redis(settings)
        self.prefix = f"{registry_namespace(settings.topic_prefix)}:dead-letters:"

    async def has(self, name: str) -> bool:
        return bool(await self.client.exists(self.prefix + name))

    async def add(self, name: str, ttl_s: float | None) -> None:
        await self.client.set(self.prefix + name, b"1", px=None if ttl_s is None else int(ttl_s * 1000))

    async def close(self) -> None:
        await self.client.aclose()


class DirectoryMarks:
    """Marks as empty files under ``path`` (created when the first one is stored); no expiry."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def has(self, name: str) -> bool:
        return (self.path / name).exists()

    async def add(self, name: str, ttl_s: float | None) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / name).touch()

    async def close(self) -> None:
        return None


def open_marks(settings: Settings) -> Marks:
    """The marks beside the model registry: Redis when ``REDIS_URL`` is set, else ``{RTT_MODELS_DIR}/dead-letters``."""
    if settings.redis_url:
        return RedisMarks(settings)
    return DirectoryMarks(settings.models_path / "dead-letters")


def mark_name(rec: Any) -> str:
    """The mark of a consumed record: topic, partition, offset, timestamp (ms) and the CRC-32 of its value.

    >>> class R: topic, partition, offset, timestamp, value = "training-samples", 3, 17, 1700000000123, b"{"
    >>> mark_name(R())
    'training-samples.3.17.1700000000123.15d54739'
    """
    value = rec.value if isinstance(rec.value, bytes | bytearray) else str(rec.value or "").encode()
    return f"{rec.topic}.{int(rec.partition)}.{int(rec.offset)}.{int(rec.timestamp)}.{zlib.crc32(value):08x}"


def mark_ttl_s(source: str) -> float | None:
    """How long the mark of a bad message of contract ``source`` is kept: the topic's retention (the message is
    gone then), for a compacted topic the dead-letters topic's (its dead letter is gone then); ``None``: for ever.

    >>> mark_ttl_s("training-samples") == mark_ttl_s("model-updates") == 14 * 86400
    True
    """
    retention = contract(source).retention_ms
    if retention <= 0:
        retention = contract("dead-letters").retention_ms
    return retention / 1000 if retention > 0 else None


class TrainerDeadLetters:
    """Sends the dead letters of the trainer's consumers (see the module docstring)."""

    def __init__(self, settings: Settings, metrics: TrainerMetrics, clock: Clock, marks: Marks | None = None,
                 producer: AIOKafkaProducer | None = None) -> None:
        self.settings = settings
        self.producer = producer  # the trainer's, once started
        self.metrics = metrics
        self.clock = clock
        self.marks = marks if marks is not None else open_marks(settings)

    async def send(self, source: str, bad: list[tuple[Any, ContractError]], *, once: bool = True) -> int:
        """Dead-letter each record of ``bad`` (of contract ``source``) with the error it failed with; ``once``:
        but those a trainer dead-lettered before (a topic read from its start), and mark each when stored. The
        dead letters are sent together, the ones not acknowledged again until they are; how many were stored."""
        todo: list[tuple[Any, str, bytes, bytes, str]] = []  # record, reason, key, value, mark name
        for rec, exc in bad:
            name = mark_name(rec) if once else ""
            if name and await self._has(name):
                log.debug("bad %s at %s:%d dead-lettered before", source, rec.topic, rec.offset)
                continue
            record = dead_letter_record(rec, source, exc, self.clock.now())
            todo.append((rec, exc.reason, record["topic"].encode(), encode("dead-letters", record), name))
        stored = 0
        backoff = Backoff.upto(self.settings.retry_max_backoff_s)
        ttl_s = mark_ttl_s(source)
        while todo:
            again = []
            for item, result in zip(todo, await self._send_all(todo), strict=True):
                rec, reason, _, _, name = item
                if isinstance(result, KafkaError) and permanent(result):
                    log.error("dead letter of %s@%d refused by the broker: %r; given up", source, rec.offset, result)
                elif isinstance(result, BaseException):
                    again.append(item)
                else:
                    stored += 1
                    self.metrics.dead_letters.labels(topic=source, reason=reason).inc()
                    if name:
                        await self._mark(name, ttl_s)
            todo = again
            if todo:
                wait = backoff.next()
                log.warning("%d dead letter(s) of %s not stored; trying again in %.1f s", len(todo), source, wait)
                await asyncio.sleep(wait)
        return stored

    async def _send_all(self, todo: list[tuple[Any, str, bytes, bytes, str]]) -> list[Any]:
        """Send every dead letter of ``todo`` at once; each one's acknowledgement or error, in order."""
        assert self.producer is not None, "dead letters before the trainer started"
        topic = self.settings.topic("dead-letters")
        futures: list[Any] = []
        for _, _, key, value, _ in todo:
            try:
                futures.append(await self.producer.send(topic, value, key=key))
            except KafkaError as error:  # not even queued (no metadata within the producer's timeout)
                failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                failed.set_exception(error)
                futures.append(failed)
        return list(await asyncio.gather(*futures, return_exceptions=True))

    async def _has(self, name: str) -> bool:
        try:
            return await self.marks.has(name)
        except (OSError, RedisError) as error:
            log.warning("dead-letter marks unreadable (%r): dead-lettering %s anyway", error, name)
            return False

    async def _mark(self, name: str, ttl_s: float | None) -> None:
        try:
            await self.marks.add(name, ttl_s)
        except (OSError, RedisError) as error:  # read again, it is dead-lettered again
            log.warning("dead letter %s stored, its mark not: %r", name, error)

    async def close(self) -> None:
        try:
            await self.marks.close()
        except (OSError, RedisError):
            pass


__all__ = ["DirectoryMarks", "Marks", "RedisMarks", "TrainerDeadLetters", "mark_name", "mark_ttl_s", "open_marks"]
