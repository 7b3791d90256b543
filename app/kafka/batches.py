"""Producing many small records cheaply: records are collected per partition and shipped as whole batches.

``AIOKafkaProducer.send`` costs tens of microseconds per record (a future, a partition lookup, an
accumulator append). :class:`BatchSender` takes records synchronously (:meth:`BatchSender.add`, a list
append), and :meth:`BatchSender.ship` turns what was collected into record batches, one
``send_batch`` per full batch. :meth:`BatchSender.flush` waits until everything shipped is acknowledged —
the point after which a caller may record its input as processed.

Records keep their order within a partition (batches of one partition are shipped in order and the
producer sends them in order). Each acknowledgement is checked against the end the sender's previous
batch of that partition left: a batch stored at a lower offset means the partition was recreated (a broker
that lost its data) or truncated, and the partition is listed in :attr:`BatchSender.rewound` for the
caller to write again what it had stored there. The partition of a key is the Java client's and aiokafka's
(``murmur2(key) & 0x7fffffff`` modulo the partition count), so keyed records land where any other
producer would put them.

>>> partition_for(b"gpu-1", 8) == partition_for(b"gpu-1", 8)
True
>>> 0 <= partition_for(b"gCTF:gpu", 8) < 8
True
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import defaultdict
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2

Record = tuple[bytes | None, bytes | None, int]  # key, value, timestamp ms


@functools.lru_cache(maxsize=65_536)
def partition_for(key: bytes, partitions: int) -> int:
    """The partition a keyed record goes to among ``partitions`` (the default partitioner's rule)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class BatchSender:
    """Collects records per (topic, partition) and ships them as record batches on one producer."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer
        self._pending: dict[tuple[str, int], list[Record]] = defaultdict(list)
        self._in_flight: list[asyncio.Future[object]] = []
        self._end: dict[tuple[str, int], int] = {}  # offset after the last acknowledged batch
        self.rewound: set[tuple[str, int]] = set()  # (topic, partition) whose log restarted below that end
        self.records = 0

    def __len__(self) -> int:
        """Records collected and not shipped yet."""
        return sum(len(v) for v in self._pending.values())

    def add(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
        """Collect one record (``value`` None: a tombstone)."""
        self._pending[(topic, partition)].append((key, value, int(time.time() * 1000)))

    async def ship(self) -> int:
        """Hand every collected record to the producer as batches; how many records."""
        pending, self._pending = self._pending, defaultdict(list)
        n = 0
        for (topic, partition), records in pending.items():
            batch = self.producer.create_batch()
            for key, value, ts in records:
                while batch.append(key=key, value=value, timestamp=ts) is None:
                    if batch.record_count() == 0:
                        raise ValueError(f"a record of {len(value or b'')} bytes does not fit in a batch")
                    await self._send(batch, topic, partition)
                    batch = self.producer.create_batch()
            if batch.record_count():
                await self._send(batch, topic, partition)
            n += len(records)
        self.records += n
        self._in_flight = [f for f in self._in_flight if not f.done() or f.cancelled() or f.exception() is not None]
        return n

    async def _send(self, batch: Any, topic: str, partition: int) -> None:
        records = batch.record_count()
        future = await self.producer.send_batch(batch, topic, partition=partition)
        future.add_done_callback(functools.partial(self._acked, (topic, partition), records))
        self._in_flight.append(future)

    def _acked(self, tp: tuple[str, int], records: int, future: asyncio.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        base = int(future.result().offset)
        if base < 0:  # no offset known (acks=0)
            return
        if base < self._end.get(tp, 0):
            self.rewound.add(tp)
        self._end[tp] = base + records

    def take_rewound(self, topic: str) -> set[int]:
        """Partitions of ``topic`` found rewound since the last call."""
        found = {tp for tp in self.rewound if tp[0] == topic}
        self.rewound -= found
        return {p for _, p in found}

    async def flush(self) -> int:
        """Ship what is collected and wait until every shipped record is acknowledged; records shipped now.

        Raises the first delivery error, if any.
        """
        n = await self.ship()
        in_flight, self._in_flight = self._in_flight, []
        if in_flight:
            await asyncio.gather(*in_flight)
        return n
