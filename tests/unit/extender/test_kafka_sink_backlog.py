"""KafkaSink keeps one batch per partition inside the producer: records arriving while it waits ride along in
it or in the partition's open batch, shipped once the one before is taken; a full open batch drops (counted).

The producer here is a stand-in whose ``send_batch`` waits until the test lets it take the batch, as aiokafka's
does while the partition's previous batch is not sent; batches are aiokafka's own builders, read back.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.default_records import DefaultRecordBatch

from app.config import Settings
from app.extender.kafka_sink import KafkaSink
from app.extender.metrics import ExtenderMetrics
from app.kafka.batches import partition_for

LINGER_S = 0.01
KEY = b"node-a"


class HeldProducer:
    """``send_batch`` returns once :meth:`take` lets it; :meth:`send` builds (closes) the batches taken."""

    def __init__(self, batch_bytes: int = 512 * 1024) -> None:
        self.batch_bytes = batch_bytes
        self.calls: list[Any] = []  # batches handed to send_batch, in order
        self.taken: list[Any] = []
        self.sent: list[bytes] = []
        self._gate = asyncio.Event()
        self._gate.set()

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(self.batch_bytes, 0)

    def hold(self) -> None:
        self._gate.clear()

    def take(self) -> None:
        self._gate.set()

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> asyncio.Future[Any]:
        self.calls.append(batch)
        await self._gate.wait()
        self.taken.append(batch)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    def send(self) -> None:
        """The sender builds every batch taken so far (no record is appended to one after this)."""
        for batch in self.taken:
            if not batch.closed():
                self.sent.append(bytes(batch._build()))

    async def flush(self) -> None:
        self.send()

    async def stop(self) -> None:
        self.send()


def bounded(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., Coroutine[Any, Any, None]]:
    """A test that fails within 5 s where a sink waits for ever (one that awaits a held send_batch)."""
    @functools.wraps(test)
    async def run(*args: Any, **kwargs: Any) -> None:
        await asyncio.wait_for(test(*args, **kwargs), 5)
    return run


def sink_with(producer: HeldProducer, metrics: ExtenderMetrics) -> KafkaSink:
    sink = KafkaSink(Settings(), metrics, linger_s=LINGER_S)
    sink._producer, sink._partitions = producer, 8
    return sink


def values(sent: list[bytes]) -> list[bytes]:
    return [r.value for buf in sent for r in DefaultRecordBatch(buf)]


def records(start: int, n: int, size: int = 10) -> list[tuple[bytes, bytes]]:
    return [(KEY, b"%0*d" % (size, i)) for i in range(start, start + n)]


@bounded
async def test_records_ride_along_while_the_partition_waits_and_ship_in_order() -> None:
    producer, metrics = HeldProducer(), ExtenderMetrics()
    sink = sink_with(producer, metrics)
    producer.hold()  # the partition's previous batch is not sent: send_batch waits
    await sink.send_many(records(0, 3))
    await asyncio.sleep(LINGER_S * 3)
    assert len(producer.calls) == 1  # one batch inside the producer
    for i in range(3, 30):  # more linger periods go by: no new batch, the waiting one takes them
        await sink.send_many(records(i, 1))
        await asyncio.sleep(LINGER_S / 2)
    assert len(producer.calls) == 1 and producer.calls[0].record_count() == 30
    producer.take()
    await asyncio.sleep(0)
    await sink.send_many(records(30, 2))  # taken, not sent yet: still appended to it
    producer.send()
    await sink.send_many(records(32, 3))  # sent: into a new batch, shipped after linger
    await asyncio.sleep(LINGER_S * 3)
    assert len(producer.calls) == 2
    producer.send()
    assert values(producer.sent) == [v for _, v in records(0, 35)]
    assert metrics.dropped._value.get() == 0
    await sink.close()


@bounded
async def test_an_open_batch_ships_as_soon_as_the_one_before_is_taken() -> None:
    producer, metrics = HeldProducer(batch_bytes=1024), ExtenderMetrics()
    sink = sink_with(producer, metrics)
    producer.hold()
    await sink.send_many(records(0, 14, size=100))  # more than one batch holds: the second waits in the sink
    await asyncio.sleep(LINGER_S * 3)
    assert len(producer.calls) == 1
    open_batch = sink._open[partition_for(KEY, 8)]
    producer.take()
    await asyncio.sleep(0.001)
    assert producer.calls[-1] is open_batch  # due since the linger: shipped at once, not a linger later
    producer.send()
    assert values(producer.sent) == [v for _, v in records(0, 14, size=100)]
    await sink.close()


@bounded
async def test_a_full_open_batch_drops_counts_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    producer, metrics = HeldProducer(batch_bytes=1024), ExtenderMetrics()
    sink = sink_with(producer, metrics)
    producer.hold()
    await sink.send_many(records(0, 1, size=100))
    await asyncio.sleep(LINGER_S * 3)  # handed over, waiting
    with caplog.at_level(logging.WARNING, logger="app.extender.kafka_sink"):
        await sink.send_many(records(1, 60, size=100))  # fills the waiting batch, then the open one
    kept = producer.calls[0].record_count() + sink._open[partition_for(KEY, 8)].record_count()
    assert metrics.dropped._value.get() == 61 - kept > 0
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith(f"rtt-predictions delivery of {61 - kept} records failed: ")
    producer.take()
    await sink.close()  # what was kept is delivered, in order
    assert values(producer.sent) == [v for _, v in records(0, kept, size=100)]
    assert metrics.published._value.get() == kept


@bounded
async def test_close_ships_every_open_batch_and_waits_for_the_held_ones() -> None:
    producer, metrics = HeldProducer(batch_bytes=1024), ExtenderMetrics()
    sink = sink_with(producer, metrics)
    producer.hold()
    other = b"node-b" if partition_for(b"node-b", 8) != partition_for(KEY, 8) else b"node-c"
    await sink.send_many(records(0, 15, size=100) + [(other, b"x")])
    asyncio.get_running_loop().call_later(0.05, producer.take)
    await sink.close()
    assert sorted(values(producer.sent)) == sorted([v for _, v in records(0, 15, size=100)] + [b"x"])
    assert [v for v in values(producer.sent) if v != b"x"] == [v for _, v in records(0, 15, size=100)]
    assert metrics.published._value.get() == 16 and metrics.dropped._value.get() == 0


class FailingProducer(HeldProducer):
    """``send_batch`` takes the batch at once and returns its delivery future, failed by :meth:`expire` without
    building the batch: aiokafka's sender does so when the partition has no leader past the request timeout."""

    def __init__(self) -> None:
        super().__init__()
        self.futures: list[asyncio.Future[Any]] = []

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> asyncio.Future[Any]:
        self.calls.append(batch)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.futures.append(fut)
        return fut

    def expire(self) -> None:
        for fut in self.futures:
            if not fut.done():
                fut.set_exception(TimeoutError("expired: no leader"))

    async def flush(self) -> None:
        self.deliver()

    def deliver(self) -> None:
        for batch, fut in zip(self.calls, self.futures, strict=True):
            if not fut.done():
                self.sent.append(bytes(batch._build()))
                fut.set_result(None)


@bounded
async def test_a_batch_failed_before_it_was_sent_takes_no_more_records() -> None:
    producer, metrics = FailingProducer(), ExtenderMetrics()
    sink = sink_with(producer, metrics)
    await sink.send_many(records(0, 10))
    await asyncio.sleep(LINGER_S * 3)  # handed over, still open inside the producer
    producer.expire()
    await sink.send_many(records(10, 5))  # failed, its callback not run yet: counted with it
    await asyncio.sleep(0)
    for i in range(15, 60, 5):  # after it: a new batch
        await sink.send_many(records(i, 5))
        await asyncio.sleep(LINGER_S / 2)
    await asyncio.sleep(LINGER_S * 3)
    producer.deliver()
    await asyncio.sleep(0)
    assert metrics.dropped._value.get() == 15
    assert metrics.published._value.get() == 45
    assert values(producer.sent) == [v for _, v in records(15, 45)]
    await sink.close()


@bounded
async def test_drops_are_said_once_per_report_period_and_their_sum_at_its_end(
        caplog: pytest.LogCaptureFixture) -> None:
    producer, metrics = HeldProducer(batch_bytes=1024), ExtenderMetrics()
    sink = KafkaSink(Settings(), metrics, linger_s=LINGER_S, report_s=0.3)
    sink._producer, sink._partitions = producer, 8
    producer.hold()
    await sink.send_many(records(0, 1, size=100))
    await asyncio.sleep(LINGER_S * 3)  # handed over, held
    with caplog.at_level(logging.WARNING, logger="app.extender.kafka_sink"):
        for i in range(50):  # 50 calls dropping, within one report period
            await sink.send_many(records(i * 20, 20, size=100))
            await asyncio.sleep(0.002)
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1
        await asyncio.sleep(0.4)  # the period ends: the sum of the drops since the first line
        said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2
    counts = [int(line.split()[3]) for line in said]
    assert sum(counts) == metrics.dropped._value.get() > 900
    producer.take()
    await sink.close()


def test_report_s_must_be_positive() -> None:
    with pytest.raises(ValueError, match="report_s must be > 0"):
        KafkaSink(Settings(), report_s=0)
