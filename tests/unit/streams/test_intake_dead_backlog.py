"""Dead letters the broker does not take stop the intake reading, as its other backlogs do.

The dead-letters partition unavailable while the source topics are readable: every batch's dead letters
(up to about 88 KB each) stayed on the intake's sender and the intake read on, batch after batch, while each
checkpoint's flush failed. Now it reads nothing more while its sender holds more than
``DEAD_HELD_MAX_BYTES`` of undelivered dead letters, and reads on once the broker has taken enough of them.
Here a real :class:`BatchSender` over a stand-in producer that never settles a batch until the test says so.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from intake_standins import Batch, Record
from prometheus_client import CollectorRegistry

import app.streams.intake as intake_module
from app.clock import ManualClock
from app.config import Settings
from app.kafka.batches import BatchSender
from app.kafka.positions import PositionGuard
from app.streams.deadletter import DeadLetters
from app.streams.intake import PartitionIntake

S = Settings.from_env({"RTT_METRICS_PORT": "0"}, topic_prefix="u-")
C = S.topic("task-completions")
DEAD = S.topic("dead-letters")
BOUND = 1 << 20  # the bound for this test (64 MiB in the worker)
RAW = b"{" + b"x" * 40_000  # invalid JSON: a dead letter of about 54 KB
PER_BATCH = 4


class Producer:
    """Takes every batch and settles none until :meth:`deliver` (the dead-letters partition has no leader)."""

    def __init__(self) -> None:
        self.flying: list[tuple[asyncio.Future[Any], Batch]] = []
        self.stored = 0

    def create_batch(self) -> Batch:
        return Batch()

    async def send_batch(self, batch: Batch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.flying.append((fut, batch))
        return fut

    def held_bytes(self) -> int:
        return sum(len(v or b"") for _, b in self.flying for _, v in b.records)

    def deliver(self) -> None:
        for fut, batch in self.flying:
            fut.set_result(SimpleNamespace(offset=self.stored))
            self.stored += batch.record_count()
        self.flying.clear()


class Consumer:
    """Every fetch returns ``PER_BATCH`` invalid messages of partition 0."""

    def __init__(self) -> None:
        self.calls = 0

    async def getmany(self, **_kw: Any) -> dict[TopicPartition, list[Any]]:
        self.calls += 1
        first = (self.calls - 1) * PER_BATCH
        return {TopicPartition(C, 0): [Record(first + i, RAW) for i in range(PER_BATCH)]}

    def assignment(self) -> set[TopicPartition]:
        return set()

    def highwater(self, _tp: TopicPartition) -> int | None:
        return None


def dead_letters(tmp_path: Path) -> DeadLetters:
    from app.streams.app import create_app
    from app.streams.options import WorkerOptions

    app = create_app(S, id="dead-backlog", options=WorkerOptions.from_settings(S, datadir=str(tmp_path)))
    return DeadLetters(app, S)


async def test_reading_pauses_while_the_sender_holds_too_many_dead_letter_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(intake_module, "DEAD_HELD_MAX_BYTES", BOUND, raising=False)
    dead = dead_letters(tmp_path)
    it = PartitionIntake(S, {"task-completions": lambda c, p: None}, dead, clock=ManualClock(3.0),
                         metrics=dead.metrics)
    it.assign({0}, {("task-completions", 0): 0})
    it._assignment_changed = False
    producer, consumer = Producer(), Consumer()
    it.sender = BatchSender(producer, on_delivered=it._delivered, on_failed=it._failed)  # type: ignore[arg-type]
    it._consumer = consumer  # type: ignore[assignment]
    it.guard = PositionGuard(consumer, "intake", registry=CollectorRegistry())

    async def reading() -> None:
        while True:
            await it._step()
            await asyncio.sleep(0)

    flushes = 0
    flush = it.sender.flush

    async def counted_flush(*args: Any, **kwargs: Any) -> Any:
        nonlocal flushes
        flushes += 1
        return await flush(*args, **kwargs)

    it.sender.flush = counted_flush  # type: ignore[method-assign]
    caplog.set_level(logging.INFO, logger="app.streams.intake")
    task = asyncio.create_task(reading())
    try:
        for _ in range(200):
            await asyncio.sleep(0)
        letter = producer.held_bytes() // (consumer.calls * PER_BATCH)
        per_batch = PER_BATCH * letter
        # it read until its sender held more than the bound, then no more (one batch past it at most)
        assert consumer.calls <= BOUND // per_batch + 2, consumer.calls
        assert producer.held_bytes() <= BOUND + per_batch
        assert dead.metrics.value("rtt_worker_dead_letters_total", topic="task-completions",
                                  reason="invalid_json") == 0
        paused = [r for r in caplog.records if "paused" in r.getMessage()]
        assert len(paused) == 1 and paused[0].exc_info is None
        # paused, it waits on the batches in flight instead of asking again and again
        calls, waits = consumer.calls, flushes
        for _ in range(500):
            await asyncio.sleep(0)
        assert consumer.calls == calls and 1 <= flushes <= waits + 1, (flushes, waits)

        calls = consumer.calls
        producer.deliver()  # the broker takes them: it reads on
        for _ in range(20):
            await asyncio.sleep(0)
        assert consumer.calls > calls
        assert dead.metrics.value("rtt_worker_dead_letters_total", topic="task-completions",
                                  reason="invalid_json") >= calls * PER_BATCH
        resumed = [r for r in caplog.records if "resumed" in r.getMessage()]
        assert len(resumed) == 1 and resumed[0].exc_info is None
        assert len([r for r in caplog.records if "paused" in r.getMessage()]) <= 2
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert intake_module.DEAD_HELD_MAX_BYTES == BOUND
    monkeypatch.undo()
    assert intake_module.DEAD_HELD_MAX_BYTES == 64 << 20
