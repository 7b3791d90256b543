"""rtt-predictions on Kafka: the publisher's sink (see :class:`KafkaSink`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.conn import CloseReason
from aiokafka.errors import KafkaTimeoutError

from app.config import Settings
from app.extender.metrics import ExtenderMetrics
from app.extender.predictions import Record
from app.kafka.batches import partition_for
from app.kafka.client import client_options

log = logging.getLogger(__name__)
TOPIC = "rtt-predictions"
BATCH_BYTES = 512 * 1024  # record batch size: building and shipping a batch costs ~0.1 ms whatever its size
# Open batches ship this long after their first record. aiokafka builds one produce request from every ready
# batch, in one loop step whose length grows with the bytes (~1 MB, 2-3 ms, from 50 ms of requests flat out);
# 20 ms keeps that step near 1 ms for ~5 us more CPU per request (docs/extender.md).
LINGER_S = 0.02
# close() delivers what it holds for at most this long, then counts what was not sent dropped and stops the producer
# in STOP_S more at most (what is in flight gets STOP_S - ABORT_S to be acknowledged, then fails and the producer's
# tasks end within ABORT_S): the extender's stop fits the pod's grace period while the broker is away, and the
# publisher's wait for it (publisher.CLOSE_S) is never what ends it.
CLOSE_S = 4.0
STOP_S = 1.0
ABORT_S = 0.2


_NO_HEADERS: list[tuple[str, bytes]] = []


def _append(batch: Any, key: bytes, value: bytes, ts_ms: int) -> bool:
    """Append one record to an aiokafka (0.14) ``BatchBuilder``; False when the batch is full or closed.

    ``BatchBuilder.append`` without its per-record Python layer (keyword arguments, serializers the
    producer does not have, a timestamp read per record): a third of the cost of publishing a prediction.
    """
    if batch._closed:
        return False
    if batch._builder.append(batch._relative_offset, ts_ms, key, value, _NO_HEADERS) is None:
        return False
    batch._relative_offset += 1
    return True


def _consume(batch: Any) -> None:
    """The sink reads a batch through its own future; a failed one's exception is known, not left unretrieved."""
    for fut in (batch.future, batch._drain_waiter):
        if fut.done() and not fut.cancelled():
            fut.exception()


def _fail_queued(producer: Any, exc: Exception) -> None:
    """Fail the batches the aiokafka (0.14) producer holds and has not sent, and take them from its queues so that
    its sender never sends them (a batch in flight is left to its acknowledgement or failure)."""
    accumulator = producer._message_accumulator
    batches = [b for queue in accumulator._batches.values() for b in queue]
    accumulator._batches.clear()
    for batch in batches:
        batch.failure(exc)
        _consume(batch)


def _abort(producer: Any, exc: Exception) -> None:
    """Fail what the aiokafka (0.14) producer still holds, in flight or not, and close its connections: each produce
    request in flight ends at once with a connection error, which fails its batch (expired first, so never queued
    again), and the sender's request tasks are over. Nothing here waits."""
    accumulator = producer._message_accumulator
    pending = list(accumulator._pending_batches)
    for batch in pending:
        batch._ttl = -1.0
    _fail_queued(producer, exc)
    for batch in pending:
        batch.failure(exc)
        _consume(batch)
    for conn in list(getattr(producer.client, "_conns", {}).values()):
        conn.close(reason=CloseReason.SHUTDOWN)


async def _stop(producer: Any, exc: Exception) -> None:
    """Stop the aiokafka (0.14) producer within ``STOP_S``: it waits for what is in flight, then closes. Past
    ``STOP_S - ABORT_S`` what it holds fails (:func:`_abort`) and its sender task is cancelled and awaited, with
    the stop, for ``ABORT_S`` at most: no task of the producer's is left pending."""
    stop = asyncio.get_running_loop().create_task(producer.stop())
    done, _ = await asyncio.wait({stop}, timeout=STOP_S - ABORT_S)
    if not done:
        by = time.monotonic() + ABORT_S
        _abort(producer, exc)
        sender = getattr(getattr(producer, "_sender", None), "sender_task", None)
        if sender is not None and not sender.done():
            sender.cancel()
        await asyncio.wait({t for t in (stop, sender) if t is not None}, timeout=max(0.0, by - time.monotonic()))
        if not stop.done():  # in the client's close: its connections are closed already
            stop.cancel()
            await asyncio.wait({stop}, timeout=max(0.0, by - time.monotonic()))
    if stop.done() and not stop.cancelled() and stop.exception() is not None:
        log.debug("rtt-predictions producer stop failed: %s", stop.exception())


class KafkaSink:
    """rtt-predictions on Kafka: records collected into one open batch per partition, shipped when full or
    ``linger_s`` after the first record (one aiokafka producer, acks=1). Requests share batches: shipping
    costs per batch, appending a record about a microsecond.

    At most one batch per partition is handed to the producer and not yet sent: aiokafka (0.14) queues one
    batch per partition and sends one request per broker at a time, so a batch handed over while another
    waits would only wait in turn (and, a batch per ``linger_s`` with a produce round trip above it, the
    waits grew without end until ``send_batch`` timed out). Records go into the handed batch until the
    producer sends it, then into the partition's open batch, shipped ``linger_s`` after its first record or
    as soon as the producer takes the one before: a record waits about two round trips of a slow broker
    (handed batch, then request), one ``linger_s`` of a quick one. When a partition's open batch is full
    while the one before still waits to be taken, further records of that partition are dropped and counted
    (the broker is not keeping up with 512 KiB a round trip). A partition's records reach the broker in the
    order appended. Once the producer is done with a handed batch (acknowledged, or failed without sending it:
    no leader past the request timeout, the sender down), nothing more goes into it.

    The partition of a key is the default partitioner's (:func:`app.kafka.batches.partition_for`), so the
    worker's join sees a node's predictions where any producer would have put them. A failed delivery counts
    its batch's records as dropped, an acknowledged one as published: ``rtt_extender_predictions_published_total``
    counts what the broker has, not what was handed over; drops are said in one WARNING per ``report_s``, the
    first at once, then the sum of those since. :meth:`start` fails (and the publisher retries) while
    the broker or the topic is missing; the topic is looked up in the cluster's metadata, which never creates it.
    :meth:`close` ships every open batch and waits for the producer to deliver them, for ``CLOSE_S`` at most:
    what was not sent then is counted dropped and the producer stopped, in ``STOP_S`` more at most (a batch in
    flight is counted as its acknowledgement says, dropped when none came within that).
    """

    def __init__(self, settings: Settings, metrics: ExtenderMetrics | None = None, linger_s: float = LINGER_S,
                 report_s: float = 10.0) -> None:
        if report_s <= 0:
            raise ValueError(f"report_s must be > 0 (got {report_s})")
        self.topic = settings.topic(TOPIC)
        self._settings = settings
        self._metrics = metrics
        self._linger_s = linger_s
        self._producer: Any = None
        self._partitions = 0
        self._open: dict[int, Any] = {}  # partition -> batch being filled, not handed over yet
        self._handed: dict[int, Any] = {}  # partition -> batch handed over, appended to until the producer sends it
        self._busy: dict[int, asyncio.Task[None]] = {}  # partition -> its send_batch, waiting for the one before
        self._due: set[int] = set()  # partitions whose open batch ships once their send_batch is over
        self._timer: asyncio.TimerHandle | None = None
        self._shipping: set[asyncio.Task[None]] = set()
        self._report_s = report_s
        self._unsaid = 0  # records dropped since the last WARNING, said at the end of its report period
        self._unsaid_exc: BaseException | None = None
        self._said_at: float | None = None  # monotonic time of the last WARNING
        self._report: asyncio.TimerHandle | None = None

    async def start(self) -> None:
        producer = AIOKafkaProducer(**client_options(self._settings, acks=1, max_batch_size=BATCH_BYTES))
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
        if self._producer is None:
            raise RuntimeError("the rtt-predictions producer is not connected")
        ts = int(time.time() * 1000)  # one timestamp for the records of one call (one request's)
        dropped: dict[int, int] = {}
        opened = False
        for key, value in records:
            partition = partition_for(key, self._partitions)
            handed = self._handed.get(partition)
            if handed is not None:
                if _append(handed, key, value, ts):
                    continue
                del self._handed[partition]  # sent or full: later records go after it, never into it
            batch = self._open.get(partition)
            if batch is None:
                batch = self._open[partition] = self._producer.create_batch()
                opened = True
            if _append(batch, key, value, ts):
                continue
            if partition in self._busy:  # full, and the one before not taken yet
                dropped[partition] = dropped.get(partition, 0) + 1
                continue
            self._hand_over(partition)
            batch = self._open[partition] = self._producer.create_batch()
            if not _append(batch, key, value, ts):
                raise ValueError(f"an rtt-predictions record of {len(value)} bytes does not fit in a batch")
        if opened and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._linger_s, self._linger)
        for partition, n in dropped.items():
            self._failed(n, BufferError(f"partition {partition}'s batch is full and the one before not sent yet"))

    def _linger(self) -> None:
        self._timer = None
        for partition in list(self._open):
            if partition in self._busy:
                self._due.add(partition)
            else:
                self._hand_over(partition)

    def _hand_over(self, partition: int) -> None:
        """Ship the partition's open batch (its send_batch not busy): appended to until the producer sends it."""
        batch = self._open.pop(partition)
        self._due.discard(partition)
        self._handed[partition] = batch
        task = asyncio.get_running_loop().create_task(self._ship_one(batch, partition))
        self._busy[partition] = task
        self._shipping.add(task)
        task.add_done_callback(self._shipping.discard)

    async def _ship_one(self, batch: Any, partition: int) -> None:
        try:
            await self._ship(batch, partition)
        except (Exception, asyncio.CancelledError) as exc:  # cancelled: by close(), never inside the producer
            if self._handed.get(partition) is batch:
                del self._handed[partition]
            batch.close()  # nothing appended past the count
            self._failed(batch.record_count(), exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            del self._busy[partition]
        if partition in self._due and partition in self._open:
            self._hand_over(partition)

    async def _ship(self, batch: Any, partition: int) -> None:
        if batch.record_count():
            fut = await self._producer.send_batch(batch, self.topic, partition=partition)
            # counted when delivered: records appended after the hand-over travel in the batch too
            fut.add_done_callback(lambda f: self._done_with(f, batch, partition))  # first: closed, then counted
            fut.add_done_callback(lambda f: self._delivered(f, batch.record_count()))
        else:
            batch.close()

    def _done_with(self, fut: asyncio.Future[Any], batch: Any, partition: int) -> None:
        """The producer is done with a handed batch: sent and acknowledged, or failed, perhaps without being built
        (no leader past the request timeout, the sender down), so still open; closed here, nothing more goes in."""
        if self._handed.get(partition) is batch:
            del self._handed[partition]
        if fut.cancelled() or fut.exception() is not None:
            batch.close()  # sent ones are closed already

    def _delivered(self, fut: asyncio.Future[Any], n: int) -> None:
        if fut.cancelled():
            self._failed(n, asyncio.CancelledError())
        elif fut.exception() is not None:
            self._failed(n, fut.exception())
        elif self._metrics is not None:
            self._metrics.published.inc(n)

    def _failed(self, n: int, exc: BaseException | None) -> None:
        """Count dropped records; say them at once when nothing was said for ``report_s``, else at its end."""
        if self._metrics is not None:
            self._metrics.dropped.inc(n)
        self._unsaid += n
        self._unsaid_exc = exc
        now = time.monotonic()
        if self._said_at is None or now - self._said_at >= self._report_s:
            self._say()
        elif self._report is None:
            self._report = asyncio.get_running_loop().call_later(self._said_at + self._report_s - now, self._say)

    def _say(self) -> None:
        if self._report is not None:
            self._report.cancel()
            self._report = None
        if not self._unsaid:
            return
        log.warning("rtt-predictions delivery of %d records failed: %s", self._unsaid, self._unsaid_exc)
        self._said_at = time.monotonic()
        self._unsaid, self._unsaid_exc = 0, None

    async def _ship_open(self) -> None:
        """Ship every open batch, each once its partition's send_batch is over, and wait until all are handed."""
        while True:
            self._linger()
            shipping = [task for task in self._shipping if not task.done()]
            if not shipping:
                return
            await asyncio.gather(*shipping, return_exceptions=True)

    async def close(self, timeout_s: float = CLOSE_S) -> None:
        """Ship every open batch and wait for the producer to deliver what it holds, ``timeout_s`` at most: then
        what was not sent is counted dropped and the producer stopped, within ``STOP_S`` more (:func:`_stop`)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        producer = self._producer
        if producer is not None:
            deadline = time.monotonic() + timeout_s
            with contextlib.suppress(Exception):  # TimeoutError: cancelled, each batch counted dropped
                await asyncio.wait_for(self._ship_open(), timeout_s)
            self._producer = None
            for batch in self._open.values():  # open still: not handed over in time
                self._failed(batch.record_count(), KafkaTimeoutError("not handed to the producer before close"))
            self._open.clear()
            self._due.clear()
            try:
                await asyncio.wait_for(producer.flush(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:  # what was never sent is dropped; what is in flight has STOP_S to be acknowledged
                _fail_queued(producer, KafkaTimeoutError("not sent before close"))  # counted by the callbacks
            self._handed.clear()
            await _stop(producer, KafkaTimeoutError("not delivered before close"))
        self._say()
