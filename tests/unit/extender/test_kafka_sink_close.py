"""KafkaSink.close() with a producer that does not finish: bounded at ``timeout_s + STOP_S``, strictly within the
publisher's wait for it, nothing of the producer's left pending, the final drop WARNING said; and at the deadline
only what was never sent is dropped, a batch in flight counted as its acknowledgement says."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any

import pytest

from app.config import Settings
from app.extender import kafka_sink, publisher
from app.extender.kafka_sink import KafkaSink
from app.extender.metrics import ExtenderMetrics


class FakeBatch:
    """What the sink touches of an aiokafka (0.14) ``MessageBatch``."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.future: asyncio.Future[Any] = loop.create_future()
        self._drain_waiter: asyncio.Future[None] = loop.create_future()
        self._ttl = 40.0

    def failure(self, exception: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exception)

    def done(self) -> None:
        if not self.future.done():
            self.future.set_result(None)


class FakeAccumulator:
    def __init__(self) -> None:
        self._batches: dict[Any, collections.deque[FakeBatch]] = collections.defaultdict(collections.deque)
        self._pending_batches: set[FakeBatch] = set()

    def fail_all(self, exception: BaseException) -> None:
        for batch in [b for queue in self._batches.values() for b in queue] + list(self._pending_batches):
            batch.failure(exception)


class FakeProducer:
    """A producer whose flush never ends; ``stop()`` ends ``ack_after`` s after it began (never when None), having
    acknowledged the batches in flight, or hangs in its sender task like aiokafka's against a silent broker."""

    def __init__(self, ack_after: float | None) -> None:
        self._message_accumulator = FakeAccumulator()
        self._sender = type("Sender", (), {})()
        self._sender.sender_task = asyncio.get_running_loop().create_task(asyncio.Event().wait())
        self.client = type("Client", (), {"_conns": {}, "close": self.flush})()
        self._ack_after = ack_after

    async def flush(self) -> None:
        await asyncio.Event().wait()

    async def stop(self) -> None:
        if self._ack_after is None:
            await self._sender.sender_task  # cancelled: the sender's requests wait for answers that never come
            await asyncio.Event().wait()
        await asyncio.sleep(self._ack_after)
        for batch in list(self._message_accumulator._pending_batches):
            batch.done()
        self._sender.sender_task.cancel()


def counts(metrics: ExtenderMetrics) -> tuple[float, float]:
    return metrics.published._value.get(), metrics.dropped._value.get()


def track(sink: KafkaSink, batch: FakeBatch, n: int) -> None:
    batch.future.add_done_callback(lambda f: sink._delivered(f, n))


def test_close_with_a_producer_that_never_stops_is_bounded_and_says_its_drops(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> tuple[float, FakeProducer, set[asyncio.Task[Any]]]:
        metrics = ExtenderMetrics()
        sink = KafkaSink(Settings(metrics_port=0), metrics)
        producer = FakeProducer(ack_after=None)
        sink._producer, sink._partitions = producer, 1
        inflight = FakeBatch()
        producer._message_accumulator._pending_batches.add(inflight)
        track(sink, inflight, 7)
        sink._failed(1, RuntimeError("earlier"))  # said at once; what follows waits for the report period's end
        t0 = time.monotonic()
        await sink.close(timeout_s=0.5)
        took = time.monotonic() - t0
        left = {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}
        return took, producer, left

    with caplog.at_level(logging.WARNING, logger="app.extender.kafka_sink"):
        took, producer, left = asyncio.run(main())
    assert took <= 0.5 + kafka_sink.STOP_S + 0.05, f"close took {took:.2f} s, documented at most timeout + STOP_S"
    assert producer._sender.sender_task.done() and not left, f"left pending: {left}"
    said = [r.getMessage() for r in caplog.records if "rtt-predictions delivery" in r.getMessage()]
    assert any(m.startswith("rtt-predictions delivery of 7 records failed") for m in said), said


def test_close_s_plus_stop_s_stays_below_the_publishers_wait() -> None:
    assert kafka_sink.CLOSE_S + kafka_sink.STOP_S < publisher.CLOSE_S


async def test_at_the_deadline_only_unsent_batches_drop_and_an_ack_during_stop_counts() -> None:
    metrics = ExtenderMetrics()
    sink = KafkaSink(Settings(metrics_port=0), metrics)
    producer = FakeProducer(ack_after=0.1)
    sink._producer, sink._partitions = producer, 1
    queued, inflight = FakeBatch(), FakeBatch()
    producer._message_accumulator._batches["tp"].append(queued)
    producer._message_accumulator._pending_batches.add(inflight)
    track(sink, queued, 3)
    track(sink, inflight, 5)
    await sink.close(timeout_s=0.2)
    await asyncio.sleep(0)
    assert counts(metrics) == (5, 3)
    assert not producer._message_accumulator._batches, "a batch failed at the deadline is never sent"
