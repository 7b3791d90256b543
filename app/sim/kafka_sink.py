"""A simulator :class:`~app.sim.sinks.Sink` that produces to Kafka, for live runs against the real system.

The simulator is synchronous (SimPy) and must never wait on the broker, so the sink owns an asyncio loop in
a daemon thread (:class:`LoopThread`) with one aiokafka producer. :meth:`KafkaSink.emit` checks the value
against its topic contract, encodes it in the caller's thread and hands the bytes to the loop
(``call_soon_threadsafe``); a background task produces them in order. Keys are the contract's key (the
node for node-metrics and task-completions), topic names come from ``settings.topic(name)``.

A value that breaks its contract is counted in ``rejected`` and never sent; a full queue (broker far
behind) counts in ``dropped``; a failed delivery in ``failed``. :meth:`KafkaSink.close` flushes and waits.

Usage::

    sink = KafkaSink(settings).start()
    sim = build_simulation(config, policy, seed, sink=sink)   # the cluster closes the sink at the end
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from aiokafka import AIOKafkaProducer

from app.config import Settings
from app.contracts import encode
from app.errors import ContractError, RttError
from app.kafka.client import client_options

log = logging.getLogger(__name__)
T = TypeVar("T")


class SinkError(RttError):
    """The Kafka sink could not reach the broker or was used after it was closed."""


class LoopThread:
    """An asyncio event loop running in a daemon thread; synchronous code submits coroutines to it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run ``coro`` on the loop and wait for its result (at most ``timeout_s``)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        """Stop the loop and join its thread (idempotent)."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10.0)
        if not self._thread.is_alive():
            self.loop.close()


class KafkaSink:
    """Produce simulator messages to Kafka without blocking the simulation.

    Parameters
    ----------
    settings : Settings
        ``bootstrap_servers`` and ``topic_prefix``.
    check : bool
        Validate every value against its contract before sending (default True).
    max_pending : int
        Messages queued for the producer at most; beyond, new messages are dropped and counted.
    """

    def __init__(self, settings: Settings, *, check: bool = True, max_pending: int = 100_000) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending: must be >= 1 (got {max_pending})")
        self.settings = settings
        self.check = check
        self.max_pending = max_pending
        self.emitted = self.sent = self.failed = self.rejected = self.dropped = 0
        self._loop: LoopThread | None = None
        self._queue: asyncio.Queue[tuple[str, bytes, bytes] | None] | None = None
        self._producer: Any = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    # -- lifecycle
    def start(self, timeout_s: float = 20.0) -> KafkaSink:
        """Connect the producer (raises :class:`SinkError` if the broker does not answer in time)."""
        if self._loop is not None:
            return self
        self._loop = LoopThread("kafka-sink")
        try:
            self._loop.call(self._start(), timeout_s)
        except Exception as exc:
            self._loop.stop()
            self._loop = None
            raise SinkError(f"cannot produce to Kafka at {self.settings.bootstrap_servers}: {exc}") from exc
        return self

    async def _start(self) -> None:
        self._queue = asyncio.Queue(self.max_pending)
        self._producer = AIOKafkaProducer(**client_options(self.settings, acks=1, linger_ms=5))
        await self._producer.start()
        self._task = asyncio.get_running_loop().create_task(self._drain(), name="kafka-sink-drain")

    async def _drain(self) -> None:
        assert self._queue is not None
        while True:
            item = await self._queue.get()
            if item is None:
                return
            topic, key, raw = item
            try:
                fut = await self._producer.send(topic, value=raw, key=key)
                fut.add_done_callback(self._delivered)
            except Exception as exc:
                self.failed += 1
                log.warning("producing to %s failed: %s", topic, exc)

    def _delivered(self, fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled() and fut.exception() is None:
            self.sent += 1
        else:
            self.failed += 1

    # -- Sink protocol
    def emit(self, topic: str, key: str, value: dict[str, Any]) -> None:
        """Check, encode and queue one message for ``topic`` (contract name); never blocks."""
        if self._closed or self._loop is None:
            raise SinkError("emit on a Kafka sink that is not started or already closed")
        try:
            raw = encode(topic, value, check=self.check)
        except ContractError as exc:
            self.rejected += 1
            if self.rejected == 1:
                log.warning("%s message rejected by its contract (not sent): %s", topic, exc)
            return
        self.emitted += 1
        self._loop.loop.call_soon_threadsafe(self._enqueue, self.settings.topic(topic), key.encode(), raw)

    def _enqueue(self, topic: str, key: bytes, raw: bytes) -> None:
        assert self._queue is not None
        try:
            self._queue.put_nowait((topic, key, raw))
        except asyncio.QueueFull:
            self.dropped += 1

    def close(self, timeout_s: float = 15.0) -> None:
        """Send what is queued, flush the producer, stop the loop (idempotent)."""
        if self._closed:
            return
        self._closed = True
        loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            loop.call(self._finish(), timeout_s)
        except Exception as exc:
            log.warning("kafka sink did not flush cleanly: %s", exc)
        finally:
            loop.stop()

    async def _finish(self) -> None:
        if self._queue is not None and self._task is not None:
            await self._queue.put(None)
            with contextlib.suppress(Exception):
                await self._task
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await self._producer.flush()
            await self._producer.stop()

    def stats(self) -> dict[str, int]:
        """Counters: emitted (queued), sent (acknowledged), failed, rejected (contract), dropped (queue full)."""
        return {"emitted": self.emitted, "sent": self.sent, "failed": self.failed, "rejected": self.rejected,
                "dropped": self.dropped}
