"""Producing many small records cheaply, and every one of them until the broker has it.

``AIOKafkaProducer.send`` costs tens of microseconds per record (a future, a partition lookup, an
accumulator append). :class:`BatchSender` takes records synchronously (:meth:`BatchSender.add`, a list
append), and :meth:`BatchSender.ship` turns what was collected into record batches, one
``send_batch`` per full batch. :meth:`BatchSender.flush` waits until everything shipped is acknowledged —
the point after which a caller may record its input as processed.

**Delivery.** A record leaves the sender only once the broker acknowledged it, or failed it for good. A
batch the broker did not take — away past the producer's request timeout (``KafkaTimeoutError``), no
leader, a connection lost — is kept and sent again, ahead of newer records of its partition, by the next
:meth:`~BatchSender.ship` or :meth:`~BatchSender.flush`; the flush that waited for it raises its error, so
a caller records nothing as processed while a record it produced is undelivered (the worker's checkpoint
writes its read positions only after such a flush). A resent batch the broker had in fact stored arrives
twice (at least once; the readers keep one copy: the trainer one row per task, compacted topics the
latest value). Errors that sending again cannot cure — the record is too large
(``MessageSizeTooLarge``, ``RecordListTooLarge``), it or its topic is invalid (``InvalidTopic``,
``CorruptRecord``, ``InvalidTimestamp``), the client may not write the topic
(``TopicAuthorizationFailed``) — drop the batch: logged at ERROR, reported to ``on_failed`` with outcome
``dropped``, and raised by the flush that waited for it; a record that could block its partition for ever
is never kept. ``on_delivered(topic, records)`` is called for each acknowledged batch with the records
acknowledged for the first time: count what was sent there, not when a record is added; ``on_failed(topic,
records, error, outcome)`` for each failed one (``retried`` | ``dropped``). Failures are logged (WARNING,
ERROR for a drop; once per period each with :func:`app.kafka.quiet.quiet_client_errors`).

**Discarding.** :meth:`BatchSender.discard` drops every record of some partitions of a topic that the broker
has not acknowledged: collected, to be sent again, being handed over, or in a batch still in flight (which,
failed, is not sent again — nor one that failed queued behind it —, and which a flush neither waits for nor
raises the error of; taken, it is stored and counted delivered). The worker calls it for a table's
changelog partitions when it loses them: its new owner writes them from then on, and a record this worker
sent there afterwards would land among, or after, the new owner's. Discarded records are never counted
delivered nor reported to ``on_failed``; they are counted in :attr:`BatchSender.discarded` and logged at
INFO (the caller says why).

Records keep their order within a partition: batches of one partition are shipped in order, one
:meth:`~BatchSender.ship` at a time. A failed batch is sent again once every batch of its partition shipped
before the resend is settled, and the batches shipped after it that the broker did take are sent again
behind it (at least once), so the newest value of a key is still the last one in the log — a compacted
topic (node-features, a changelog) never ends with an older value, or with a value behind its tombstone.
Each acknowledgement is
checked against the end the sender's previous batch of that partition left: a batch stored at a lower
offset means the partition was recreated (a broker that lost its data) or truncated, and the partition is
listed in :attr:`BatchSender.rewound` for the caller to write again what it had stored there. The
partition of a key is the Java client's and aiokafka's (``murmur2(key) & 0x7fffffff`` modulo the
partition count), so keyed records land where any other producer would put them.

>>> partition_for(b"gpu-1", 8) == partition_for(b"gpu-1", 8)
True
>>> 0 <= partition_for(b"gCTF:gpu", 8) < 8
True
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Collection
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTimestampError,
    InvalidTopicError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    TopicAuthorizationFailedError,
)
from aiokafka.partitioner import murmur2

log = logging.getLogger(__name__)

Record = tuple[bytes | None, bytes | None, int]  # key, value, timestamp ms
_Rec = tuple[bytes | None, bytes | None, int, bool]  # ... and whether it was counted delivered (a resend)
TP = tuple[str, int]  # topic, partition
DELIVERED, RETRIED, DROPPED, DISCARDED = "delivered", "retried", "dropped", "discarded"
# the broker refuses the record itself, or the topic for good: sending it again cannot succeed
PERMANENT: tuple[type[BaseException], ...] = (
    MessageSizeTooLargeError, RecordListTooLargeError, InvalidTopicError, CorruptRecordException,
    InvalidTimestampError, TopicAuthorizationFailedError)

Delivered = Callable[[str, int], None]  # (topic, records) acknowledged
Failed = Callable[[str, int, BaseException, str], None]  # (topic, records, error, RETRIED | DROPPED)


@functools.lru_cache(maxsize=65_536)
def partition_for(key: bytes, partitions: int) -> int:
    """The partition a keyed record goes to among ``partitions`` (the default partitioner's rule)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def permanent(exc: BaseException) -> bool:
    """Whether a delivery error means the batch can never be delivered (dropped, not sent again).

    >>> permanent(MessageSizeTooLargeError()), permanent(KafkaError("batch expired"))
    (True, False)
    """
    return isinstance(exc, PERMANENT)


@dataclasses.dataclass(slots=True)
class _Shipment:
    """One batch handed to the producer: its records (with whether each was counted delivered) and outcome."""

    records: list[_Rec]
    fresh: int  # records not counted delivered before (not a resend of a delivered one)
    outcome: str = ""  # "" in flight, then DELIVERED, RETRIED (to send again), DROPPED (failed for good) or DISCARDED
    discarded: bool = False  # its partition was discarded while it flew: not sent again if it fails
    future: asyncio.Future[Any] | None = None  # its acknowledgement
    serial: int = 0  # in the order the sender shipped its batches


class BatchSender:
    """Collects records per (topic, partition) and ships them as record batches on one producer, until delivered."""

    def __init__(self, producer: AIOKafkaProducer, *, on_delivered: Delivered | None = None,
                 on_failed: Failed | None = None) -> None:
        self.producer = producer
        self.on_delivered = on_delivered
        self.on_failed = on_failed
        self._pending: dict[TP, list[_Rec]] = defaultdict(list)  # to send, in order
        self._redo: dict[TP, list[_Rec]] = defaultdict(list)  # to send again, ahead of the pending ones
        self._flights: dict[TP, collections.deque[_Shipment]] = defaultdict(collections.deque)  # in shipping order
        self._futures: dict[TP, set[asyncio.Future[Any]]] = defaultdict(set)
        self._lock = asyncio.Lock()
        self._resent_pending: set[TP] = set()  # partitions whose pending records include resent ones (put back)
        self._end: dict[TP, int] = {}  # offset after the last acknowledged batch
        self._discards: dict[TP, int] = {}  # how many times each partition was discarded (a ship in progress checks)
        self._shipped = 0  # batches handed to the producer so far (the serial of the last)
        self._redo_since: dict[TP, int] = {}  # serial of the earliest batch whose records wait in _redo
        self.rewound: set[TP] = set()  # (topic, partition) whose log restarted below that end
        self.records = 0  # records shipped (a resend counts again)
        self.delivered = 0  # records acknowledged, each once
        self.dropped = 0  # records failed for good
        self.discarded = 0  # records dropped undelivered by :meth:`discard`

    def __len__(self) -> int:
        """Records collected and not shipped yet (failed ones waiting to be sent again included)."""
        return sum(len(v) for v in self._pending.values()) + self.undelivered

    @property
    def undelivered(self) -> int:
        """Records waiting to be sent again."""
        return sum(len(v) for v in self._redo.values())

    def add(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
        """Collect one record (``value`` None: a tombstone)."""
        self._pending[(topic, partition)].append((key, value, int(time.time() * 1000), False))

    async def ship(self) -> int:
        """Hand every collected record, and every one to send again first, to the producer as batches; how many.

        A send the producer does not take (its queue for the partition stays full past the request timeout,
        no metadata) raises; the records not handed over stay, in order, for the next call.
        """
        n = 0
        async with self._lock:
            for tp in list(self._pending.keys() | self._redo.keys()):
                if self._redo.get(tp) and self._futures.get(tp):
                    await asyncio.wait(set(self._futures[tp]))  # every earlier batch settled: the resend goes last
                redo = self._redo.pop(tp, [])
                self._redo_since.pop(tp, None)
                records = redo + self._pending.pop(tp, [])
                resent = len(records) if tp in self._resent_pending else len(redo)
                self._resent_pending.discard(tp)
                if records:
                    n += await self._ship(tp, records, resent)
        return n

    async def _ship(self, tp: TP, records: list[_Rec], redo: int) -> int:
        """Send ``records`` of ``tp`` in batches (those sent before, maybe counted, among the first ``redo``);
        how many."""
        start = 0  # records[:start] handed over (or dropped)
        discards = self._discards.get(tp, 0)
        try:
            batch = self.producer.create_batch()
            for i, (key, value, ts, _) in enumerate(records):
                if batch.append(key=key, value=value, timestamp=ts) is not None:
                    continue
                if batch.record_count():
                    await self._send(batch, tp, records, start, i, redo, discards)
                    start = i
                    if self._discards.get(tp, 0) != discards:
                        break
                    batch = self.producer.create_batch()
                if batch.append(key=key, value=value, timestamp=ts) is None:  # alone too large (aiokafka takes it)
                    self._failure(tp, [records[i]], MessageSizeTooLargeError(f"{len(value or b'')} bytes"))
                    start = i + 1
                    batch = self.producer.create_batch()
            else:
                if batch.record_count():
                    await self._send(batch, tp, records, start, len(records), redo, discards)
                start = len(records)
        except BaseException:
            if self._discards.get(tp, 0) != discards:  # discarded while it was handed over: nothing goes back
                self._discarded(tp, len(records) - start)
            else:
                self._pending[tp][:0] = records[start:]  # ahead of what was added meanwhile
                if start < redo:
                    self._resent_pending.add(tp)
            raise
        if start < len(records):  # discarded while a batch was handed over: the rest is not sent
            self._discarded(tp, len(records) - start)
        self.records += start
        return start

    async def _send(self, batch: Any, tp: TP, records: list[_Rec], start: int, end: int, redo: int,
                    discards: int) -> None:
        future = await self.producer.send_batch(batch, tp[0], partition=tp[1])
        counted = sum(1 for r in records[start:min(end, redo)] if r[3])  # only a resend holds counted records
        self._shipped += 1
        shipment = _Shipment(records[start:end], end - start - counted,
                             discarded=self._discards.get(tp, 0) != discards,  # discarded while handed over
                             future=future, serial=self._shipped)
        self._flights[tp].append(shipment)
        self._futures[tp].add(future)
        future.add_done_callback(functools.partial(self._settled, tp, shipment))

    def _settled(self, tp: TP, shipment: _Shipment, future: asyncio.Future[Any]) -> None:
        futures = self._futures.get(tp)
        if futures is not None:
            futures.discard(future)
            if not futures:
                del self._futures[tp]
        if future.cancelled() or future.exception() is not None:
            exc = KafkaError("delivery cancelled (the producer stopped)") if future.cancelled() else future.exception()
            assert exc is not None
            if shipment.discarded:
                self._discarded(tp, len(shipment.records))
                shipment.outcome = DISCARDED
            else:
                shipment.outcome = self._failure(tp, shipment.records, exc)
        else:
            shipment.outcome = DELIVERED
            records = shipment.records
            fresh = shipment.fresh
            self.delivered += fresh
            base = int(future.result().offset)
            if base >= 0:  # an offset known (not acks=0)
                if base < self._end.get(tp, 0):
                    self.rewound.add(tp)
                self._end[tp] = base + len(records)
            if fresh and self.on_delivered is not None:
                self.on_delivered(tp[0], fresh)
        self._land(tp)

    def _land(self, tp: TP) -> None:
        """Take the settled batches at the head of ``tp``'s flights: a failed one is sent again, and so is every
        one shipped after it that the broker took (its records already counted). A failed one whose partition was
        discarded since (it failed behind one still in flight) is dropped, counted discarded."""
        flights, redo = self._flights[tp], self._redo[tp]
        while flights and flights[0].outcome:
            shipment = flights.popleft()
            if shipment.outcome == RETRIED and shipment.discarded:
                self._discarded(tp, len(shipment.records))
                shipment.outcome = DISCARDED
            elif shipment.outcome == RETRIED:
                redo += shipment.records
                self._redo_since[tp] = min(self._redo_since.get(tp, shipment.serial), shipment.serial)
            elif shipment.outcome == DELIVERED and redo:  # taken after one that failed: sent again behind it
                redo += [(k, v, ts, True) for k, v, ts, _ in shipment.records]
        if not flights:
            del self._flights[tp]
        if not redo:
            del self._redo[tp]
            self._redo_since.pop(tp, None)

    def _failure(self, tp: TP, records: list[_Rec], exc: BaseException) -> str:
        if permanent(exc):
            self.dropped += len(records)
            log.error("delivery to %s[%d] failed for good (%r): %d records dropped", tp[0], tp[1], exc, len(records))
            outcome = DROPPED
        else:
            log.warning("delivery to %s[%d] failed (%r): %d records kept, sent again", tp[0], tp[1], exc,
                        len(records))
            outcome = RETRIED
        if self.on_failed is not None:
            self.on_failed(tp[0], len(records), exc, outcome)
        return outcome

    def discard(self, topic: str, partitions: Collection[int]) -> int:
        """Drop every record of ``partitions`` of ``topic`` the broker has not acknowledged: those collected or to
        be sent again now (how many: the return value), those a ship in progress is handing over, and those in
        flight should their batch fail (one the broker takes is stored). Not counted delivered, not reported to
        ``on_failed``: counted in :attr:`discarded`. The partitions leave :attr:`rewound` too."""
        n = 0
        for partition in partitions:
            tp = (topic, partition)
            self._discards[tp] = self._discards.get(tp, 0) + 1
            n += len(self._pending.pop(tp, ())) + len(self._redo.pop(tp, ()))
            self._redo_since.pop(tp, None)
            self._resent_pending.discard(tp)
            self.rewound.discard(tp)
            for shipment in self._flights.get(tp, ()):
                shipment.discarded = True
        self._discarded_log(topic, partitions, n)
        return n

    def _discarded(self, tp: TP, records: int) -> None:
        self._discarded_log(tp[0], [tp[1]], records)

    def _discarded_log(self, topic: str, partitions: Collection[int], records: int) -> None:
        if records:
            self.discarded += records
            log.info("%d undelivered records to %s%s discarded", records, topic, sorted(partitions))

    def forget(self, topic: str, partitions: Collection[int]) -> None:
        """Forget the end the last acknowledged batch left on ``partitions`` of ``topic``, and that they were found
        rewound: their recreation was found and handled elsewhere (the worker's recovery), so the next batch
        stored at their new start is not reported again."""
        for partition in partitions:
            tp = (topic, partition)
            self._end.pop(tp, None)
            self.rewound.discard(tp)

    def end(self, topic: str, partition: int) -> int | None:
        """The offset after the last batch acknowledged on ``partition`` of ``topic``; None if none was."""
        return self._end.get((topic, partition))

    def take_rewound(self, topic: str) -> set[int]:
        """Partitions of ``topic`` found rewound since the last call."""
        found = {tp for tp in self.rewound if tp[0] == topic}
        self.rewound -= found
        return {p for _, p in found}

    async def flush(self) -> int:
        """Ship what is collected (what is to be sent again first) and wait until every shipped record is
        acknowledged; records shipped now.

        Raises the first delivery error of the batches it waited for, or, when none failed, while records of an
        earlier failed batch are still to be sent again (one that failed behind a batch in flight goes back only
        as that one settles); the failed batches stay to be sent again (those failed for good are dropped), so a
        later flush that returns has delivered them. A batch
        of a discarded partition is not waited for, and its error is not raised: nothing of it is sent again.
        """
        n = await self.ship()
        shipped = self._shipped  # the batches this flush answers for: shipped up to now
        shipments = {s.future: s for flights in self._flights.values() for s in flights if s.future is not None}
        flying = {f for fs in self._futures.values() for f in fs
                  if (s := shipments.get(f)) is None or not s.discarded}
        if flying:
            await asyncio.wait(flying)  # not gather: a cancelled flush leaves the deliveries alone
            for f in flying:
                if (s := shipments.get(f)) is not None and s.discarded:  # discarded while the flush waited
                    continue
                if f.cancelled():
                    raise KafkaError("delivery cancelled (the producer stopped)")
                exc = f.exception()
                if exc is not None:
                    raise exc
        # a batch shipped before the flush that failed behind one in flight went back to be sent again only as
        # that one settled: not delivered, so the flush has not done its job (a batch shipped since, by another
        # caller, is that caller's)
        again = sum(len(self._redo.get(tp, ())) for tp, since in self._redo_since.items() if since <= shipped)
        if again:
            raise KafkaError(f"{again} records of a failed delivery are still to be sent again")
        return n
