"""Messages the trainer reads that break their contract go to dead-letters with the reason, each once.

The trainer reads three topics. A bad **retrain-event** is read once by the trainers' group: it is
dead-lettered, then committed like any event that ended. **training-samples** and **model-updates** are
read from their start by every trainer (and model-updates by every worker and extender, which count and log
a bad one): a restarted trainer reads the same bad message again. It is dead-lettered the first time a
trainer reads it: a mark named by its topic, partition, offset, record timestamp (-1 for a record without one)
and the CRC-32 of its bytes is stored once the dead letter is (Redis ``SET`` under the registry's namespace; a
file under ``{RTT_MODELS_DIR}/dead-letters`` with the directory registry), and a message whose mark exists is
counted and logged only. The timestamp and the checksum keep a new bad message at an old offset of a recreated
topic (the broker lost its data, the topic was deleted) from being taken for the old one: a record keeps the
timestamp it was written with, a new one has its own, even with the same bytes. A mark of the earlier name
(topic, partition, offset and checksum, no timestamp) is taken for the record at its place once: it is
replaced by the record's mark, with its expiry, so a message dead-lettered before the upgrade is not sent again.

A Redis mark expires (:func:`mark_ttl_s`) with the topic's retention, after which the message is gone (an hour
at least: a topic with ``retention.ms=0`` still serves a message until its segment is deleted); for a topic that
keeps its values (model-updates, compacted: a bad value stays until its key has a new one) with the dead-letters
topic's, after which its dead letter is gone: a trainer that reads the value again then dead-letters it again.
When neither topic deletes, the mark expires after 14 days all the same: no mark is kept for ever. A file mark
(the directory registry, without Redis) expires the same way: it holds the time it expires (:class:`DirectoryMarks`);
one found expired is taken for absent and removed, and the directory is swept of expired marks at the first lookup
and every :data:`SWEEP_EVERY` marks stored, so it holds the marks of one retention, not every bad message ever read.
When the marks cannot be read (Redis away, a mark file unreadable), the message is dead-lettered anyway: a second
copy rather than none.

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
import contextlib
import hashlib
import logging
import math
import os
import threading
import uuid
import zlib
from pathlib import Path
from typing import Any, Protocol

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from redis.exceptions import RedisError

from app.clock import Clock, SystemClock
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


UNBOUNDED_MARK_TTL_S = 14 * 86400.0  # a mark's life when neither its topic nor dead-letters deletes (retention -1)
MIN_MARK_TTL_S = 3600.0  # retention.ms=0 deletes a message once its segment rolls, not at once
SWEEP_EVERY = 1_000  # file marks stored between two sweeps of the expired ones
_PART = ".part"  # the end of the name of a file mark being written
NAME_MAX = 255  # the longest file name (bytes) of most file systems


class Marks(Protocol):
    """Names stored once; both calls may raise ``OSError`` or ``RedisError`` (the store away)."""

    async def has(self, name: str) -> bool: ...

    async def add(self, name: str, ttl_s: float) -> None: ...

    async def replace(self, old: str, name: str, ttl_s: float) -> None:
        """Store ``name`` in place of ``old`` (removed)."""
        ...

    async def close(self) -> None: ...


class RedisMarks:
    """Marks as Redis keys ``{namespace}:dead-letters:{name}``."""

    def __init__(self, settings: Settings) -> None:
        self.client = settings_redis(settings)
        self.prefix = f"{registry_namespace(settings.topic_prefix)}:dead-letters:"

    async def has(self, name: str) -> bool:
        return bool(await self.client.exists(self.prefix + name))

    async def add(self, name: str, ttl_s: float) -> None:
        await self.client.set(self.prefix + name, b"1", px=int(ttl_s * 1000))

    async def replace(self, old: str, name: str, ttl_s: float) -> None:
        async with self.client.pipeline(transaction=True) as pipe:  # both or neither
            pipe.set(self.prefix + name, b"1", px=int(ttl_s * 1000))
            pipe.delete(self.prefix + old)
            await pipe.execute()

    async def close(self) -> None:
        await self.client.aclose()


class DirectoryMarks:
    """Marks as files under ``path`` (created when the first one is stored), each holding the time it expires
    (``clock.now()`` seconds, as text).

    A mark found expired is taken for absent and removed; :meth:`sweep` removes every expired one, at the first
    lookup and every ``sweep_every`` marks stored, in a thread, one sweep at a time; :meth:`close` stops a sweep
    running at its next mark and waits for its thread (the trainer's stop bounds that wait). A mark is written
    whole (a file beside it, renamed over it), so a reader sharing the directory sees the old mark or the new one;
    one with no time in it (stored by an earlier release) expires :data:`UNBOUNDED_MARK_TTL_S` after it was last
    written. A mark removed as expired just as another trainer stores it again costs a second dead letter at worst.
    A mark file that cannot be read makes its lookup raise ``OSError`` (dead-lettered anyway); one that cannot be
    removed is left, taken for absent while expired.

    >>> import tempfile
    >>> from app.clock import ManualClock
    >>> clock = ManualClock(1000.0)
    >>> marks = DirectoryMarks(Path(tempfile.mkdtemp()) / "dead-letters", clock)
    >>> asyncio.run(marks.add("t.0.5.-1.15d54739", ttl_s=60.0))
    >>> asyncio.run(marks.has("t.0.5.-1.15d54739")), asyncio.run(marks.has("t.0.6.-1.15d54739"))
    (True, False)
    >>> _ = clock.advance(60.0)  # its expiry
    >>> asyncio.run(marks.has("t.0.5.-1.15d54739"))
    False
    >>> list(marks.path.iterdir())
    []
    """

    def __init__(self, path: Path, clock: Clock | None = None, sweep_every: int = SWEEP_EVERY) -> None:
        if sweep_every < 1:
            raise ValueError(f"sweep_every must be >= 1 (got {sweep_every})")
        self.path = path
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.sweep_every = sweep_every
        self._stored = 0  # marks stored since the last sweep
        self._swept = False  # the first lookup or store sweeps
        self._sweeping: asyncio.Future[int] | None = None  # the sweep running in its thread, or the last one
        self._closed = threading.Event()  # set by close: a sweep running stops at its next mark, none starts

    async def has(self, name: str) -> bool:
        await self._sweep_once()
        path = self._file(name)
        expires = self._expiry(path)
        if expires is None:
            return False
        if expires > self.clock.now():
            return True
        self._remove(path, self.clock.now())
        return False

    async def add(self, name: str, ttl_s: float) -> None:
        await self._sweep_once()
        self.path.mkdir(parents=True, exist_ok=True)
        self._write(self._file(name), ttl_s)
        await self._stored_one()

    async def replace(self, old: str, name: str, ttl_s: float) -> None:
        try:  # a rename: a process dying meanwhile leaves the one name or the other, never both
            os.replace(self._file(old), self._file(name))
        except FileNotFoundError:  # renamed meanwhile by another trainer sharing the directory
            pass
        await self.add(name, ttl_s)  # its expiry, over the earlier release's empty file

    async def close(self) -> None:
        """Stop a sweep running, at the mark it is on, and wait for its thread; no sweep starts after."""
        self._closed.set()
        if self._sweeping is not None and not self._sweeping.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(self._sweeping)

    async def sweep(self) -> int:
        """Remove every expired mark (and a file a write cut short left beside one, an hour old); how many. A call
        while a sweep runs waits for that one (its count); none runs after :meth:`close` (0)."""
        if self._sweeping is None or self._sweeping.done():
            if self._closed.is_set():
                return 0
            self._sweeping = asyncio.ensure_future(asyncio.to_thread(self._sweep))
        return await asyncio.shield(self._sweeping)  # the caller cancelled (the trainer's stop): close waits for it

    def _sweep(self) -> int:
        now, removed = self.clock.now(), 0
        left: list[OSError] = []  # why expired marks were not removed (a read-only directory: every one), said once
        try:
            entries = list(os.scandir(self.path))
        except FileNotFoundError:  # no mark stored yet
            return 0
        except OSError as error:
            log.warning("dead-letter marks in %s not swept: %r", self.path, error)
            return 0
        for entry in entries:
            if self._closed.is_set():  # closed: the trainer stops
                break
            path = Path(entry.path)
            try:
                if entry.name.endswith(_PART):  # a write cut short (no mark name ends so: it ends in hex)
                    if entry.stat().st_mtime + MIN_MARK_TTL_S <= now:
                        removed += self._remove(path, now, part=True, left=left)
                    continue
                expires = self._expiry(path)
            except OSError as error:  # unreadable: left, looked at again by the next sweep
                log.debug("dead-letter mark %s not read: %r", entry.name, error)
                continue
            if expires is not None and expires <= now:
                removed += self._remove(path, now, left=left)
        if removed:
            log.info("removed %d expired dead-letter mark(s) from %s", removed, self.path)
        if left:
            log.warning("%d expired dead-letter mark(s) in %s not removed (the first: %r); left, taken for absent",
                        len(left), self.path, left[0])
        return removed

    async def _sweep_once(self) -> None:
        if not self._swept:
            self._swept = True
            await self.sweep()

    async def _stored_one(self) -> None:
        self._stored += 1
        if self._stored >= self.sweep_every:
            self._stored = 0
            await self.sweep()

    def _file(self, name: str) -> Path:
        """The file of the mark ``name``: so named, or, a name too long for a file (a topic of near Kafka's 249
        characters), the start of it and the SHA-256 of the whole."""
        raw = name.encode()
        if len(raw) <= NAME_MAX:
            return self.path / name
        return self.path / f"{raw[:NAME_MAX - 65].decode(errors='ignore')}.{hashlib.sha256(raw).hexdigest()}"

    def _write(self, path: Path, ttl_s: float) -> None:
        part = path.with_name(f".{uuid.uuid4().hex}{_PART}")  # as short whatever the mark's name
        try:
            part.write_text(f"{self.clock.now() + ttl_s!r}\n")
            os.replace(part, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(part)
            raise

    @staticmethod
    def _expiry(path: Path) -> float | None:
        """When the mark at ``path`` expires; None when there is none. ``OSError``: unreadable."""
        try:
            with open(path, "rb") as f:
                text, stat = f.read(64), os.fstat(f.fileno())
        except FileNotFoundError:
            return None
        try:
            expires = float(text)
        except ValueError:  # empty: stored by an earlier release, counted from when it was written
            expires = math.nan
        return expires if math.isfinite(expires) else stat.st_mtime + UNBOUNDED_MARK_TTL_S

    @classmethod
    def _remove(cls, path: Path, now: float, part: bool = False, left: list[OSError] | None = None) -> int:
        """Remove the mark at ``path`` found expired by ``now``, unless it was stored again since (read again just
        before); 1 when removed. One that cannot be removed is left: it is taken for absent while expired; why is
        logged, or added to ``left``."""
        try:
            expires = None if part else cls._expiry(path)
            if not part and (expires is None or expires > now):
                return 0
            os.unlink(path)
        except FileNotFoundError:  # removed meanwhile by another trainer's lookup or sweep
            return 0
        except OSError as error:
            if left is None:
                log.warning("expired dead-letter mark %s not removed: %r", path, error)
            else:
                left.append(error)
            return 0
        return 1


def open_marks(settings: Settings, clock: Clock | None = None) -> Marks:
    """The marks beside the model registry: Redis when ``REDIS_URL`` is set, else ``{RTT_MODELS_DIR}/dead-letters``
    (expiring by ``clock``)."""
    if settings.redis_url:
        return RedisMarks(settings)
    return DirectoryMarks(settings.models_path / "dead-letters", clock)


def mark_name(rec: Any) -> str:
    """The mark of a consumed record: topic, partition, offset, timestamp (ms; -1 for a record without one, as
    aiokafka gives a v0 record) and the CRC-32 of its value.

    >>> class R: topic, partition, offset, timestamp, value = "training-samples", 3, 17, 1700000000123, b"{"
    >>> mark_name(R())
    'training-samples.3.17.1700000000123.15d54739'
    >>> R.timestamp = None
    >>> mark_name(R())
    'training-samples.3.17.-1.15d54739'
    """
    timestamp = -1 if rec.timestamp is None else int(rec.timestamp)
    return f"{rec.topic}.{int(rec.partition)}.{int(rec.offset)}.{timestamp}.{_crc(rec)}"


def earlier_mark_name(rec: Any) -> str:
    """The name an earlier release gave the mark of ``rec``: topic, partition, offset and checksum.

    >>> class R: topic, partition, offset, timestamp, value = "training-samples", 3, 17, 1700000000123, b"{"
    >>> earlier_mark_name(R())
    'training-samples.3.17.15d54739'
    """
    return f"{rec.topic}.{int(rec.partition)}.{int(rec.offset)}.{_crc(rec)}"


def _crc(rec: Any) -> str:
    value = rec.value if isinstance(rec.value, bytes | bytearray) else str(rec.value or "").encode()
    return f"{zlib.crc32(value):08x}"



def mark_ttl_s(source: str) -> float:
    """How long the mark of a bad message of contract ``source`` is kept (seconds, always finite): the topic's
    retention (the message is gone then), ``MIN_MARK_TTL_S`` at least; for a topic that keeps its messages
    (``retention_ms`` -1: compacted, like model-updates) the dead-letters topic's (its dead letter is gone then);
    ``UNBOUNDED_MARK_TTL_S`` when that one keeps them too.

    >>> mark_ttl_s("training-samples") == mark_ttl_s("model-updates") == 14 * 86400
    True
    """
    for topic in (source, "dead-letters"):
        retention_ms = contract(topic).retention_ms
        if retention_ms >= 0:  # Kafka: -1 keeps for ever, 0 deletes as soon as it can
            return max(retention_ms / 1000, MIN_MARK_TTL_S)
    return UNBOUNDED_MARK_TTL_S


class TrainerDeadLetters:
    """Sends the dead letters of the trainer's consumers (see the module docstring)."""

    def __init__(self, settings: Settings, metrics: TrainerMetrics, clock: Clock, marks: Marks | None = None,
                 producer: AIOKafkaProducer | None = None) -> None:
        self.settings = settings
        self.producer = producer  # the trainer's, once started
        self.metrics = metrics
        self.clock = clock
        self.marks = marks if marks is not None else open_marks(settings, clock)

    async def send(self, source: str, bad: list[tuple[Any, ContractError]], *, once: bool = True) -> int:
        """Dead-letter each record of ``bad`` (of contract ``source``) with the error it failed with; ``once``:
        but those a trainer dead-lettered before (a topic read from its start), and mark each when stored. The
        dead letters are sent together, the ones not acknowledged again until they are; how many were stored."""
        todo: list[tuple[Any, str, bytes, bytes, str]] = []  # record, reason, key, value, mark name
        ttl_s = mark_ttl_s(source)
        for rec, exc in bad:
            name = mark_name(rec) if once else ""
            if name and await self._seen(rec, name, ttl_s):
                log.debug("bad %s at %s:%d dead-lettered before", source, rec.topic, rec.offset)
                continue
            record = dead_letter_record(rec, source, exc, self.clock.now())
            todo.append((rec, exc.reason, record["topic"].encode(), encode("dead-letters", record), name))
        stored = 0
        backoff = Backoff.upto(self.settings.retry_max_backoff_s)
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

    async def _seen(self, rec: Any, name: str, ttl_s: float) -> bool:
        """Whether ``rec`` was dead-lettered before: its mark ``name`` exists, or one of the earlier name, which is
        replaced by ``name`` with its expiry. False when the marks cannot be read: one lookup and one line then."""
        earlier = earlier_mark_name(rec)
        try:
            if await self.marks.has(name):
                return True
            if not await self.marks.has(earlier):
                return False
        except (OSError, RedisError) as error:
            log.warning("dead-letter marks unreadable (%r): dead-lettering %s anyway", error, name)
            return False
        try:
            await self.marks.replace(earlier, name, ttl_s)
        except (OSError, RedisError) as error:  # still there: found again next time
            log.warning("dead-letter mark %s not renamed %s: %r", earlier, name, error)
        return True

    async def _mark(self, name: str, ttl_s: float) -> None:
        try:
            await self.marks.add(name, ttl_s)
        except (OSError, RedisError) as error:  # read again, it is dead-lettered again
            log.warning("dead letter %s stored, its mark not: %r", name, error)

    async def close(self) -> None:
        try:
            await self.marks.close()
        except (OSError, RedisError):
            pass


__all__ = ["MIN_MARK_TTL_S", "SWEEP_EVERY", "UNBOUNDED_MARK_TTL_S", "DirectoryMarks", "Marks", "RedisMarks",
           "TrainerDeadLetters", "earlier_mark_name", "mark_name", "mark_ttl_s", "open_marks"]
