"""Publish rtt-predictions off the request's critical path: a bounded queue and one background task.

A handler calls :meth:`PredictionPublisher.offer` with its decision (no await; one queue item per request:
what :func:`~app.extender.predictions.prepare` keeps of the decision). The background task turns each request
into one message per candidate with a prediction (key = node), in slices (:mod:`app.extender.pacing`), and
hands them to a :class:`Sink` in batches. When the queue is full, or the sink is not connected, the request's
messages are dropped and counted — scheduling never waits for Kafka, and nothing piles up while Kafka is away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Protocol

from app.extender.kafka_sink import KafkaSink
from app.extender.metrics import ExtenderMetrics
from app.extender.pacing import Slicer
from app.extender.predictions import Prepared, Record, encode_prepared, prediction_values, prepare, prepared_count
from app.scheduler.decide import Decision

__all__ = ["KafkaSink", "PredictionPublisher", "Sink", "prediction_values"]

log = logging.getLogger(__name__)
RETRY_S = (0.5, 1.0, 2.0, 5.0)
HANDOVER = 128  # records handed to the sink at a time (a few microseconds each there)
CLOSE_S = 6.0  # the most stop() waits for the sink's close (KafkaSink bounds its own at 5 s)


class Sink(Protocol):
    async def start(self) -> None:
        """Connect (raises when it cannot; the publisher retries)."""
        ...

    async def send_many(self, records: Sequence[Record]) -> None:
        """Hand records over (may wait for buffer space, never for the broker's acknowledgement); the sink counts
        them in ``rtt_extender_predictions_published_total`` once delivered, in ``…_dropped_total`` if not."""
        ...

    async def close(self) -> None: ...


def _predicted(decision: Decision) -> int:
    """How many rtt-predictions one request makes (:meth:`Decision.published`)."""
    return 0 if decision.neutral is not None else sum(decision.fresh)


class PredictionPublisher:
    """Bounded queue of pending requests and the task that connects the sink and drains the queue into it."""

    def __init__(self, sink: Sink, metrics: ExtenderMetrics, max_pending: int = 10_000) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1 (got {max_pending})")
        self._sink = sink
        self._metrics = metrics
        self._queue: asyncio.Queue[Prepared] = asyncio.Queue(max_pending)
        self._task: asyncio.Task[None] | None = None
        self.connected = False
        self.down = False  # a connection attempt failed and none succeeded since: offers are dropped

    def offer(self, decision: Decision, ts: float, chosen: str | None = None) -> bool:
        """Queue one scored request (``chosen``: the node its pod was assumed on, marked in its prediction); False
        (its predictions counted as dropped) when full or the sink is down."""
        if decision.neutral is not None or decision.pod.app is None:
            return True
        if not self.down and not self._queue.full():
            prepared = prepare(decision, ts, chosen)
            if prepared is not None:
                self._queue.put_nowait(prepared)
            return True
        self._metrics.dropped.inc(_predicted(decision))
        return False

    def _discard(self) -> None:
        """Drop (and count) what was queued while the first connection attempt ran."""
        while not self._queue.empty():
            self._metrics.dropped.inc(prepared_count(self._queue.get_nowait()))
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
        records: list[Record] = []
        while True:
            prepared = await self._queue.get()
            slicer.restart()
            while True:
                for part in encode_prepared(prepared):
                    records += part
                    if len(records) >= HANDOVER or slicer.due():
                        await self._hand_over(records)
                        records = []
                        if slicer.due():
                            await slicer.pause()
                self._queue.task_done()
                if self._queue.empty():
                    break
                prepared = self._queue.get_nowait()
            if records:
                await self._hand_over(records)
                records = []
            if slicer.due():
                await slicer.pause()

    async def _hand_over(self, records: list[Record]) -> None:
        try:
            await self._sink.send_many(records)  # counted published by the sink once acknowledged
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._metrics.dropped.inc(len(records))
            log.warning("rtt-predictions publish failed: %s", exc)

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
        try:
            await asyncio.wait_for(self._sink.close(), CLOSE_S)
        except TimeoutError:
            log.warning("rtt-predictions: the sink did not close within %g s", CLOSE_S)
