"""Publish rtt-predictions off the request's critical path: a bounded queue and one background task.

A handler calls :meth:`PredictionPublisher.offer` with its decision (no await, no encoding, no per-node
objects: one queue item per request). The
background task turns each request into one message per scored candidate (key = node) and hands them to a
:class:`Sink`. When the queue is full the request's messages are dropped and counted — scheduling never
waits for Kafka.
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
from app.scheduler.decide import Decision, NodeVerdict

log = logging.getLogger(__name__)
TOPIC = "rtt-predictions"


class Sink(Protocol):
    async def send(self, key: bytes, value: bytes) -> None:
        """Enqueue one message (may wait for buffer space, never for the broker's acknowledgement)."""
        ...

    async def close(self) -> None: ...


def prediction_values(task_id: str, app: str, ts: float, verdicts: Sequence[NodeVerdict]) -> list[dict[str, Any]]:
    """The rtt-predictions values of one request (one per candidate with a prediction).

    A candidate's task features that node-features cannot supply (``running_pods_<app>``) go in ``features``;
    ``predicted_rtt_ms`` includes the node's residual correction, and ``correction`` says which (when not 1);
    it is null for a candidate no model covers yet (:meth:`~app.scheduler.decide.Decision.published`).
    """
    out = []
    for v in verdicts:
        predicted = v.predicted_rtt_ms if math.isfinite(v.predicted_rtt_ms) else None
        value: dict[str, Any] = {
            "task_id": task_id, "app": app, "node": v.node, "ts": ts, "predicted_rtt_ms": predicted,
            "model_version": v.model_version, "model_key": v.model_key}
        if v.features:
            value["features"] = dict(v.features)
        if v.correction != 1.0:
            value["correction"] = v.correction
        out.append(value)
    return out


class PredictionPublisher:
    """Bounded queue of pending requests and the task that drains it into ``sink``."""

    def __init__(self, sink: Sink, metrics: ExtenderMetrics, max_pending: int = 10_000) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1 (got {max_pending})")
        self._sink = sink
        self._metrics = metrics
        self._queue: asyncio.Queue[tuple[Decision, float]] = asyncio.Queue(max_pending)
        self._task: asyncio.Task[None] | None = None

    def offer(self, decision: Decision, ts: float) -> bool:
        """Queue one scored request; False (its candidates counted as dropped) when the queue is full."""
        if decision.neutral is not None or decision.pod.app is None:
            return True
        try:
            self._queue.put_nowait((decision, ts))
        except asyncio.QueueFull:
            self._metrics.dropped.inc(len(decision.published()))
            return False
        return True

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="rtt-predictions-publisher")

    async def _run(self) -> None:
        while True:
            decision, ts = await self._queue.get()
            verdicts = decision.published()
            try:
                for value in prediction_values(decision.pod.task_id, decision.pod.app or "", ts, verdicts):
                    await self._sink.send(value["node"].encode(), orjson.dumps(value))
                self._metrics.published.inc(len(verdicts))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._metrics.dropped.inc(len(verdicts))
                log.warning("rtt-predictions publish failed: %s", exc)
            finally:
                self._queue.task_done()

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait until everything queued so far was handed to the sink (bounded)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout_s)

    async def stop(self, timeout_s: float = 5.0) -> None:
        if self._task is not None:
            await self.drain(timeout_s)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._sink.close()


class KafkaSink:
    """rtt-predictions on Kafka through one aiokafka producer (acks=1, 5 ms linger); failed deliveries count."""

    def __init__(self, settings: Settings, metrics: ExtenderMetrics | None = None) -> None:
        from aiokafka import AIOKafkaProducer

        self.topic = settings.topic(TOPIC)
        self._metrics = metrics
        self._producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks=1, linger_ms=5)
        self._started = False

    async def start(self) -> None:
        await self._producer.start()
        self._started = True

    async def send(self, key: bytes, value: bytes) -> None:
        fut = await self._producer.send(self.topic, value=value, key=key)
        fut.add_done_callback(self._delivered)

    def _delivered(self, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled() or fut.exception() is None:
            return
        if self._metrics is not None:
            self._metrics.dropped.inc()
        log.warning("rtt-predictions delivery failed: %s", fut.exception())

    async def close(self) -> None:
        if self._started:
            self._started = False
            await self._producer.stop()
