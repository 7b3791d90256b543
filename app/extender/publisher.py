"""Publish rtt-predictions off the request's critical path: a bounded queue and one background task.

A handler calls :meth:`PredictionPublisher.offer` with its decision (no await, no encoding: one queue item per
request). The background task turns each request into one message per candidate with a prediction
(key = node), in slices (:mod:`app.extender.pacing`), and hands them to a :class:`Sink` in batches. When the
queue is full, or the sink is not connected, the request's messages are dropped and counted — scheduling
never waits for Kafka, and nothing piles up while Kafka is away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Sequence
from typing import Any, Protocol

import orjson

from app.config import Settings
from app.extender.metrics import ExtenderMetrics
from app.extender.pacing import Slicer
from app.scheduler.decide import Decision

log = logging.getLogger(__name__)
TOPIC = "rtt-predictions"
Record = tuple[bytes, bytes]  # key, value
RETRY_S = (0.5, 1.0, 2.0, 5.0)


class Sink(Protocol):
    async def start(self) -> None:
        """Connect (raises when it cannot; the publisher retries)."""
        ...

    async def send_many(self, records: Sequence[Record]) -> None:
        """Hand records over (may wait for buffer space, never for the broker's acknowledgement)."""
        ...

    async def close(self) -> None: ...


def prediction_values(decision: Decision, ts: float) -> list[dict[str, Any]]:
    """The rtt-predictions values of one request: one per candidate with a prediction, in candidate order.

    ``predicted_rtt_ms`` is the model's, before the contention penalty; a candidate's task features that
    node-features cannot supply (``running_pods_<app>``) go in ``features``.
    """
    task_id, app = decision.pod.task_id, decision.pod.app or ""
    rtts = decision.model_rtt_ms or decision.rtt_ms
    out = []
    for i, node in enumerate(decision.nodes):
        rtt = rtts[i]
        if not math.isfinite(rtt):
            continue
        value: dict[str, Any] = {"task_id": task_id, "app": app, "node": node, "ts": ts, "predicted_rtt_ms": rtt,
                                 "model_version": decision.model_version[i], "model_key": decision.model_key[i]}
        if decision.features and decision.features[i]:
            value["features"] = dict(decision.features[i])
        out.append(value)
    return out


def _predicted(decision: Decision) -> int:
    return sum(1 for r in (decision.model_rtt_ms or decision.rtt_ms) if math.isfinite(r))


class PredictionPublisher:
    """Bounded queue of pending requests and the task that connects the sink and drains the queue into it."""

    def __init__(self, sink: Sink, metrics: ExtenderMetrics, max_pending: int = 10_000) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1 (got {max_pending})")
        self._sink = sink
        self._metrics = metrics
        self._queue: asyncio.Queue[tuple[Decision, float]] = asyncio.Queue(max_pending)
        self._task: asyncio.Task[None] | None = None
        self.connected = False
        self.down = False  # a connection attempt failed and none succeeded since: offers are dropped

    def offer(self, decision: Decision, ts: float) -> bool:
        """Queue one scored request; False (its predictions counted as dropped) when full or the sink is down."""
        if decision.neutral is not None or decision.pod.app is None:
            return True
        if not self.down:
            try:
                self._queue.put_nowait((decision, ts))
                return True
            except asyncio.QueueFull:
                pass
        self._metrics.dropped.inc(_predicted(decision))
        return False

    def _discard(self) -> None:
        """Drop (and count) what was queued while the first connection attempt ran."""
        while not self._queue.empty():
            decision, _ = self._queue.get_nowait()
            self._metrics.dropped.inc(_predicted(decision))
            self._queue.task_done()

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="rtt-predictions-publisher")

    async def _connect(self) -> None:
        attempt = 0
        while True:
            try:
                await self._sink.start()
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if attempt == 0:
                    log.warning("rtt-predictions: sink not available (%s); retrying, predictions dropped meanwhile",
                                exc)
                self.down = True
                self._discard()
                await asyncio.sleep(RETRY_S[min(attempt, len(RETRY_S) - 1)])
                attempt += 1
        self.connected, self.down = True, False
        if attempt:
            log.info("rtt-predictions: sink connected")

    async def _run(self) -> None:
        await self._connect()
        slicer = Slicer()
        while True:
            item = await self._queue.get()
            slicer.restart()
            records: list[Record] = []
            taken = 0
            while True:
                decision, ts = item
                for value in prediction_values(decision, ts):
                    records.append((value["node"].encode(), orjson.dumps(value)))
                taken += 1
                if slicer.due() or self._queue.empty() or len(records) >= 10_000:
                    break
                item = self._queue.get_nowait()
            try:
                await self._sink.send_many(records)
                self._metrics.published.inc(len(records))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._metrics.dropped.inc(len(records))
                log.warning("rtt-predictions publish failed: %s", exc)
            finally:
                for _ in range(taken):
                    self._queue.task_done()
            if slicer.due():
                await slicer.pause()

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait until everything queued so far was handed to the sink (bounded)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout_s)

    async def stop(self, timeout_s: float = 5.0) -> None:
        if self._task is not None:
            if self.connected:
                await self.drain(timeout_s)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.connected = False
        await self._sink.close()


class KafkaSink:
    """rtt-predictions on Kafka: records batched per partition on one aiokafka producer (acks=1, 5 ms linger).

    The partition of a key is the default partitioner's (:func:`app.kafka.batches.partition_for`), so the
    worker's join sees a node's predictions where any producer would have put them. A failed delivery counts
    its batch's records as dropped. :meth:`start` fails (and the publisher retries) while the broker or the
    topic is missing; the topic is looked up in the cluster's metadata, which never creates it.
    """

    def __init__(self, settings: Settings, metrics: ExtenderMetrics | None = None) -> None:
        self.topic = settings.topic(TOPIC)
        self._settings = settings
        self._metrics = metrics
        self._producer: Any = None
        self._partitions = 0

    async def start(self) -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=self._settings.bootstrap_servers, acks=1, linger_ms=5)
        try:
            await producer.start()
            cluster = await producer.client.fetch_all_metadata()
            partitions = cluster.partitions_for_topic(self.topic)
            if not partitions:
                raise LookupError(f"topic {self.topic} does not exist (create it with `rttsched topics`)")
        except BaseException:
            with contextlib.suppress(Exception):
                await producer.stop()
            raise
        self._producer, self._partitions = producer, len(partitions)

    async def send_many(self, records: Sequence[Record]) -> None:
        from app.kafka.batches import partition_for

        if self._producer is None:
            raise RuntimeError("the rtt-predictions producer is not connected")
        by_partition: dict[int, list[Record]] = {}
        for key, value in records:
            by_partition.setdefault(partition_for(key, self._partitions), []).append((key, value))
        for partition, part in by_partition.items():
            batch = self._producer.create_batch()
            for key, value in part:
                while batch.append(key=key, value=value, timestamp=None) is None:
                    if not batch.record_count():
                        raise ValueError(f"an rtt-predictions record of {len(value)} bytes does not fit in a batch")
                    await self._ship(batch, partition)
                    batch = self._producer.create_batch()
            await self._ship(batch, partition)

    async def _ship(self, batch: Any, partition: int) -> None:
        if not batch.record_count():
            return
        n = batch.record_count()
        fut = await self._producer.send_batch(batch, self.topic, partition=partition)
        fut.add_done_callback(lambda f: self._delivered(f, n))

    def _delivered(self, fut: asyncio.Future[Any], n: int) -> None:
        if fut.cancelled() or fut.exception() is None:
            return
        if self._metrics is not None:
            self._metrics.dropped.inc(n)
        log.warning("rtt-predictions delivery of %d records failed: %s", n, fut.exception())

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()
