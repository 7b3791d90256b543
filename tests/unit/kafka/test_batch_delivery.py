"""BatchSender delivers every record until the broker has it, counts it once, and keeps a partition's order; a
discard drops, and never sends, what it holds of the partitions named (a lost changelog partition).

The producer here is a stand-in whose every batch the test acknowledges or fails (the real broker's
version of the first case is tests/integration/test_sample_delivery.py).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaError, KafkaTimeoutError, MessageSizeTooLargeError, NodeNotReadyError

from app.kafka.batches import DROPPED, RETRIED, BatchSender, permanent

T = "training-samples"
C = "worker-node-window-changelog"  # a table's changelog: its partition p belongs to the owner of partition p


class Batch:
    def __init__(self, cap: int) -> None:
        self.cap, self.records = cap, []  # type: ignore[var-annotated]

    def append(self, *, key: bytes | None, value: bytes | None, timestamp: int) -> object | None:
        if len(self.records) >= self.cap:
            return None
        self.records.append((key, value))
        return object()

    def record_count(self) -> int:
        return len(self.records)


class Producer:
    """aiokafka's ``create_batch`` / ``send_batch`` over a log per partition. With ``auto``, each batch is
    settled at once (failed with the next of ``failures``, else stored); otherwise :meth:`settle` does it."""

    def __init__(self, cap: int = 100, auto: bool = True) -> None:
        self.cap, self.auto = cap, auto
        self.log: dict[tuple[str, int], list[tuple[bytes | None, bytes | None]]] = defaultdict(list)
        self.flying: list[tuple[asyncio.Future[Any], tuple[str, int], list[Any]]] = []
        self.failures: list[BaseException | None] = []
        self.refuse: list[BaseException] = []  # send_batch itself raises these (a full queue, no metadata)

    def create_batch(self) -> Batch:
        return Batch(self.cap)

    async def send_batch(self, batch: Batch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        if self.refuse:
            raise self.refuse.pop(0)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.flying.append((fut, (topic, partition), list(batch.records)))
        if self.auto:
            self.settle(self.failures.pop(0) if self.failures else None)
        return fut

    def settle(self, error: BaseException | None = None, index: int = 0) -> None:
        fut, tp, records = self.flying.pop(index)
        if error is not None:
            fut.set_exception(error)
        else:
            base = len(self.log[tp])
            self.log[tp] += records
            fut.set_result(SimpleNamespace(offset=base))


def sender_on(producer: Producer) -> tuple[BatchSender, dict[str, list[Any]]]:
    seen: dict[str, list[Any]] = {"delivered": [], "failed": []}
    sender = BatchSender(producer,  # type: ignore[arg-type]
                         on_delivered=lambda topic, n: seen["delivered"].append((topic, n)),
                         on_failed=lambda topic, n, exc, outcome: seen["failed"].append((topic, n, outcome)))
    return sender, seen


async def test_a_batch_the_broker_did_not_take_is_sent_again_by_the_next_flush() -> None:
    """The audit's case: shipped while the broker is away, the send expires; the next checkpoint's flush
    raised the stale error and forgot the batch, so the one after that succeeded without it."""
    producer = Producer()
    sender, seen = sender_on(producer)
    producer.failures = [KafkaTimeoutError()]
    sender.add(T, 0, b"k", b"sample-1")
    await sender.ship()
    await asyncio.sleep(0)  # the failure is settled
    assert seen == {"delivered": [], "failed": [(T, 1, RETRIED)]}
    assert len(sender) == 1 and sender.undelivered == 1
    await sender.flush()  # the broker is back: sent again, ahead of anything newer
    assert producer.log[(T, 0)] == [(b"k", b"sample-1")]
    assert seen["delivered"] == [(T, 1)] and sender.delivered == 1 and len(sender) == 0


async def test_a_flush_that_waited_for_a_failed_batch_raises_and_the_next_delivers_it() -> None:
    producer = Producer()
    sender, seen = sender_on(producer)
    producer.failures = [NodeNotReadyError()]
    sender.add(T, 0, b"k", b"sample-1")
    with pytest.raises(NodeNotReadyError):
        await sender.flush()
    assert producer.log[(T, 0)] == []
    sender.add(T, 0, b"k", b"sample-2")
    await sender.flush()
    assert producer.log[(T, 0)] == [(b"k", b"sample-1"), (b"k", b"sample-2")]
    assert seen["delivered"] == [(T, 2)]


async def test_a_batch_failed_for_good_is_dropped_counted_and_never_blocks_its_partition() -> None:
    producer = Producer()
    sender, seen = sender_on(producer)
    producer.failures = [MessageSizeTooLargeError()]
    sender.add(T, 0, b"k", b"x" * 100)
    with pytest.raises(MessageSizeTooLargeError):  # the flush waiting for it says so once
        await sender.flush()
    sender.add(T, 0, b"k", b"next")
    await sender.flush()
    assert producer.log[(T, 0)] == [(b"k", b"next")]
    assert seen["failed"] == [(T, 1, DROPPED)] and sender.dropped == 1 and len(sender) == 0


async def test_a_resent_batch_never_lands_after_a_newer_value_of_its_partition() -> None:
    """Batch 1 (a=1) fails after batch 2 (a=2, then b's tombstone) was stored: both are sent again, in order,
    so a compacted reader still ends with a=2 and b deleted; each record is counted delivered once."""
    producer = Producer(cap=1, auto=False)
    sender, seen = sender_on(producer)
    sender.add(T, 0, b"a", b"1")
    await sender.ship()
    sender.add(T, 0, b"a", b"2")
    sender.add(T, 0, b"b", None)
    await sender.ship()
    assert len(producer.flying) == 3
    producer.settle(index=1)  # a=2 stored
    producer.settle(KafkaTimeoutError(), index=0)  # a=1 expired
    producer.settle()  # b's tombstone stored
    await asyncio.sleep(0)
    assert seen["delivered"] == [(T, 1), (T, 1)]
    producer.auto = True
    producer.refuse = [KafkaTimeoutError()]  # the first resend is not even taken: counted once all the same
    with pytest.raises(KafkaTimeoutError):
        await sender.flush()
    await sender.flush()
    assert producer.log[(T, 0)] == [(b"a", b"2"), (b"b", None), (b"a", b"1"), (b"a", b"2"), (b"b", None)]
    assert sorted(seen["delivered"]) == [(T, 1), (T, 1), (T, 1)] and sender.delivered == 3


async def test_records_the_producer_refuses_to_take_stay_in_order() -> None:
    """``send_batch`` itself raises (the partition's queue full past the request timeout, no metadata): the
    records not handed over stay, ahead of those added since."""
    producer = Producer(cap=2)
    sender, _ = sender_on(producer)
    for i in range(5):
        sender.add(T, 0, b"k", str(i).encode())
    producer.refuse = [KafkaTimeoutError()]
    with pytest.raises(KafkaTimeoutError):
        await sender.ship()
    assert len(sender) == 5
    sender.add(T, 0, b"k", b"5")
    await sender.flush()
    assert [v for _, v in producer.log[(T, 0)]] == [str(i).encode() for i in range(6)]


async def test_a_discard_drops_the_undelivered_records_of_those_partitions_and_nothing_else() -> None:
    """A worker that lost partition 0 while the broker was away: what it still holds of changelog partition 0
    (to send again, or collected since) must never reach the log its new owner writes. Nothing else goes: not
    the other partitions of the changelog, not the same partition of another topic (a training sample is
    keyed by task, its partition no one's to own)."""
    producer = Producer()
    sender, seen = sender_on(producer)
    producer.failures = [KafkaTimeoutError()] * 3  # the broker away: every batch expires
    sender.add(C, 0, b"gpu-0#0", b"row")
    sender.add(C, 1, b"gpu-1#0", b"row")
    sender.add(T, 0, b"task-1", b"sample")
    with pytest.raises(KafkaTimeoutError):
        await sender.flush()
    sender.add(C, 0, b"#positions|0", b"{}")  # collected after the failure, not shipped yet
    sender.rewound = {(C, 0), (C, 1)}
    assert sender.undelivered == 3 and len(sender) == 4

    assert sender.discard(C, {0}) == 2
    assert sender.discarded == 2 and sender.undelivered == 2 and len(sender) == 2
    assert sender.take_rewound(C) == {1}  # a lost partition is not the caller's to write again
    await sender.flush()  # the broker is back
    assert producer.log[(C, 0)] == []
    assert producer.log[(C, 1)] == [(b"gpu-1#0", b"row")] and producer.log[(T, 0)] == [(b"task-1", b"sample")]
    assert sorted(seen["delivered"]) == sorted([(C, 1), (T, 1)]) and sender.delivered == 2  # never counted delivered
    assert [f for f in seen["failed"] if f[2] != RETRIED] == [] and sender.dropped == 0


async def test_a_batch_in_flight_when_discarded_is_not_sent_again_if_it_fails() -> None:
    """Shipped before the discard and failed after it: dropped, and so is the batch behind it that the broker
    took (it would otherwise be sent again behind the failed one)."""
    producer = Producer(cap=1, auto=False)
    sender, seen = sender_on(producer)
    sender.add(C, 0, b"a", b"1")
    sender.add(C, 0, b"b", b"1")
    await sender.ship()
    assert len(producer.flying) == 2
    assert sender.discard(C, {0}) == 0  # nothing held but what is in flight
    producer.settle(KafkaTimeoutError())  # a=1 expired
    producer.settle()  # b=1 stored
    await asyncio.sleep(0)
    assert sender.undelivered == 0 and len(sender) == 0 and sender.discarded == 1
    assert seen["delivered"] == [(C, 1)] and sender.delivered == 1  # b was stored: counted once
    producer.auto = True
    await sender.flush()
    assert producer.log[(C, 0)] == [(b"b", b"1")]  # a=1 never sent again, b not sent behind it


async def failed_behind_one_in_flight() -> tuple[Producer, BatchSender, dict[str, list[Any]]]:
    """Two batches of partition 0 shipped one at a time: b=1 expired while a=1 is still in flight."""
    producer = Producer(cap=1, auto=False)
    sender, seen = sender_on(producer)
    sender.add(C, 0, b"a", b"1")
    sender.add(C, 0, b"b", b"1")
    await sender.ship()
    producer.settle(KafkaTimeoutError(), index=1)
    await asyncio.sleep(0)
    return producer, sender, seen


async def test_a_failed_batch_queued_behind_one_in_flight_when_discarded_is_not_sent_again() -> None:
    """The second batch failed while the first was still in flight, then the partition was discarded: once the
    first settles, the failed one is dropped (counted discarded), not put back to go to the lost partition."""
    producer, sender, seen = await failed_behind_one_in_flight()
    assert sender.discard(C, {0}) == 0
    producer.settle()  # a=1 stored
    await asyncio.sleep(0)
    assert sender.undelivered == 0 and len(sender) == 0 and sender.discarded == 1
    producer.auto = True
    await sender.flush()
    assert producer.log[(C, 0)] == [(b"a", b"1")] and seen["delivered"] == [(C, 1)]


async def test_a_flush_does_not_return_over_a_batch_that_failed_behind_one_in_flight_before_it_began() -> None:
    """The second batch failed while the first was in flight, before the flush began: it goes back to be sent
    again only as the first settles, so the flush that waited for the first has not delivered it and raises; the
    next flush sends it."""
    producer, sender, seen = await failed_behind_one_in_flight()
    flushing = asyncio.ensure_future(sender.flush())
    await asyncio.sleep(0)
    producer.settle()  # a=1 stored
    with pytest.raises(KafkaError, match="still to be sent again"):
        await flushing
    assert sender.undelivered == 1
    producer.auto = True
    await sender.flush()
    assert producer.log[(C, 0)] == [(b"a", b"1"), (b"b", b"1")] and sender.undelivered == 0


async def test_a_flush_answers_for_what_was_shipped_before_it_not_for_a_batch_another_caller_ships_meanwhile(
        ) -> None:
    """The checkpoint's flush waits for its rows while the intake ships a later batch that fails: the rows are
    stored, so the flush returns; the later batch is the intake's, sent again by its next ship."""
    producer = Producer(cap=10, auto=False)
    sender, _ = sender_on(producer)
    sender.add(C, 0, b"row", b"1")
    flushing = asyncio.ensure_future(sender.flush())
    await asyncio.sleep(0)
    sender.add(T, 3, b"sample", b"x")
    await sender.ship()
    producer.settle(KafkaTimeoutError(), index=1)  # the later sample expires
    await asyncio.sleep(0)
    producer.settle()  # the checkpoint's row stored
    assert await flushing == 1
    assert sender.undelivered == 1
    producer.auto = True
    await sender.flush()
    assert producer.log[(T, 3)] == [(b"sample", b"x")] and sender.undelivered == 0


async def test_a_flush_neither_waits_for_nor_raises_the_error_of_a_discarded_batch_in_flight() -> None:
    """The checkpoint after a revoke flushes the sender while a batch of the lost partition is still in flight:
    its failure is not the flush's (nothing of it is sent again), so the flush returns once the rest is stored."""
    producer = Producer(cap=1, auto=False)
    sender, seen = sender_on(producer)
    sender.add(C, 0, b"a", b"1")
    await sender.ship()
    assert sender.discard(C, {0}) == 0
    sender.add(T, 0, b"task-1", b"sample")
    flushing = asyncio.ensure_future(sender.flush())
    for _ in range(3):
        await asyncio.sleep(0)
    assert len(producer.flying) == 2
    producer.settle(index=1)  # the sample stored
    producer.settle(KafkaTimeoutError())  # a=1 expired
    assert await flushing == 1  # before: KafkaTimeoutError
    assert sender.discarded == 1 and sender.undelivered == 0
    assert producer.log[(C, 0)] == [] and producer.log[(T, 0)] == [(b"task-1", b"sample")]
    assert seen["failed"] == [] and seen["delivered"] == [(T, 1)]


async def test_a_discard_while_the_partition_is_being_shipped_stops_its_shipment() -> None:
    """The intake's ship may be handing the partition's batches over when the table discards them: the batch
    being handed over is in flight (not sent again if it fails), the rest is not sent, and a send the producer
    refuses puts nothing of the partition back."""
    for refused in (False, True):
        producer = Producer(cap=1)
        sender, seen = sender_on(producer)
        entered, release = asyncio.Event(), asyncio.Event()
        send_batch = producer.send_batch

        async def slow_send(batch: Batch, topic: str, *, partition: int) -> asyncio.Future[Any]:
            entered.set()
            await release.wait()
            if refused:
                raise KafkaTimeoutError()
            producer.failures = [KafkaTimeoutError()]  # the batch handed over expires
            return await send_batch(batch, topic, partition=partition)

        producer.send_batch = slow_send  # type: ignore[method-assign]
        for i in range(3):
            sender.add(C, 0, b"k", str(i).encode())
        shipping = asyncio.ensure_future(sender.ship())
        await entered.wait()
        assert sender.discard(C, {0}) == 0  # the three are the ship's now
        release.set()
        if refused:
            with pytest.raises(KafkaTimeoutError):
                await shipping
        else:
            await shipping
        await asyncio.sleep(0)
        assert len(sender) == 0 and sender.discarded == 3, refused
        producer.send_batch = send_batch  # type: ignore[method-assign]
        await sender.flush()
        assert producer.log[(C, 0)] == [] and seen["delivered"] == []


async def test_a_partition_discarded_then_held_again_is_written_as_before() -> None:
    producer = Producer()
    sender, seen = sender_on(producer)
    producer.failures = [KafkaTimeoutError()]
    sender.add(C, 0, b"a", b"old")
    with pytest.raises(KafkaTimeoutError):
        await sender.flush()
    sender.discard(C, [0])
    sender.add(C, 0, b"a", b"new")  # the partition came back: its state read again, written from there
    await sender.flush()
    assert producer.log[(C, 0)] == [(b"a", b"new")] and seen["delivered"] == [(C, 1)]


def test_what_sending_again_cannot_cure() -> None:
    assert permanent(MessageSizeTooLargeError()) and not permanent(KafkaTimeoutError())
    assert not permanent(NodeNotReadyError()) and not permanent(OSError("connection reset"))
