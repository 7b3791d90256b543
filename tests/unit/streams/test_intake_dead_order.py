"""A batch's effects, its dead letters and the read positions past it change in one step, and a checkpoint
stores the dead letters before those positions: a restart never applies a batch twice (its effects stored
with the positions from before it), and the positions never pass a message whose dead letter is not stored.

The dead letters go out on the intake's own sender (here a real :class:`BatchSender` over a stand-in producer
whose batches the test acknowledges or fails); the checkpoint is :func:`write_rows` with the intake's
positions last, as the tables write it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError
from intake_standins import Producer, Record

from app.clock import ManualClock
from app.config import Settings
from app.contracts import decode
from app.errors import ContractError
from app.kafka.batches import BatchSender
from app.streams.changelog import write_rows
from app.streams.deadletter import DeadLetters
from app.streams.intake import PartitionIntake, decode_positions

S = Settings.from_env({"RTT_METRICS_PORT": "0"}, topic_prefix="u-")
C = S.topic("task-completions")
DEAD = S.topic("dead-letters")
CHANGELOG = "u-feedback-changelog"


def completion(task: str) -> bytes:
    return orjson.dumps({"task_id": task, "app": "gCTF", "node": "n1", "submitted_ts": 0.5, "started_ts": 1.0,
                         "finished_ts": 2.0, "rtt_ms": 1000.0, "status": "ok"})


def dead_letters(tmp_path: Path) -> DeadLetters:
    from app.streams.app import create_app
    from app.streams.options import WorkerOptions

    app = create_app(S, id="dead-order", options=WorkerOptions.from_settings(S, datadir=str(tmp_path)))
    dead = DeadLetters(app, S)

    async def send_all(bad: list[Any]) -> None:
        raise AssertionError(f"a started intake waited for its dead letters: {bad}")

    dead.send_all = send_all  # type: ignore[method-assign]
    return dead


def intake(tmp_path: Path, handled: list[str], refuse: str = "") -> tuple[PartitionIntake, Producer]:
    """An intake as started: its sender over a stand-in producer, partition 0 read from offset 0."""
    def on_completion(c: dict[str, Any], partition: int) -> None:
        if c["task_id"] == refuse:
            raise ContractError("node_cap", "full")
        handled.append(c["task_id"])

    dead = dead_letters(tmp_path)
    it = PartitionIntake(S, {"task-completions": on_completion}, dead, clock=ManualClock(3.0), metrics=dead.metrics)
    it.assign({0}, {("task-completions", 0): 0})
    producer = Producer()
    it.sender = BatchSender(producer, on_delivered=it._delivered, on_failed=it._failed)  # type: ignore[arg-type]
    return it, producer


def batch(*records: Record) -> dict[TopicPartition, list[Any]]:
    return {TopicPartition(C, 0): list(records)}


MIXED = batch(Record(0, completion("t1")), Record(1, b"{"), Record(2, completion("t2")), Record(3, completion("t3")))


def in_one_step(it: PartitionIntake, records: dict[TopicPartition, list[Any]]) -> int:
    """Run ``it.process(records)``, failing if it yields to the event loop (where a checkpoint could run)."""
    coro = it.process(records)
    with pytest.raises(StopIteration) as done:
        coro.send(None)
    return int(done.value.value)


def checkpoint(it: PartitionIntake, table: SimpleNamespace) -> Any:
    """What a table's checkpoint writes: its rows (none here), then the read positions, then markers."""
    rows = it.position_rows(lambda p: f"{p}|positions".encode())
    return write_rows(table, [], last=rows, sender=it.sender)


def changelog() -> SimpleNamespace:
    return SimpleNamespace(data={}, changelog_topic=SimpleNamespace(get_topic_name=lambda: CHANGELOG))


def dead_count(it: PartitionIntake, reason: str) -> float:
    return it.metrics.value("rtt_worker_dead_letters_total", topic="task-completions", reason=reason)


async def test_a_batch_s_effects_dead_letters_and_positions_change_in_one_step(tmp_path: Path) -> None:
    """A contract failure used to be awaited (sent and stored) before the batch was applied: the check and the
    wait cost a second pass over the batch, and an error of the send ended the worker. Now its dead letter is
    handed to the sender with the refusals', in message order, in the step that applies the batch."""
    handled: list[str] = []
    it, producer = intake(tmp_path, handled, refuse="t2")
    assert in_one_step(it, MIXED) == 4
    assert handled == ["t1", "t3"] and it.positions_of() == {0: {"task-completions": 4}}
    assert producer.log == [] and len(it.sender or ()) == 2  # on the sender, not sent yet
    await it.sender.ship()  # type: ignore[union-attr]
    await asyncio.sleep(0)  # the acknowledgements are settled
    letters = [decode("dead-letters", v) for _, _, v in producer.log]
    assert [(topic, key) for topic, key, _ in producer.log] == [(DEAD, C.encode())] * 2
    assert [(d["topic"], d["offset"], d["reason"]) for d in letters] == [(C, 1, "invalid_json"), (C, 2, "node_cap")]
    assert (dead_count(it, "invalid_json"), dead_count(it, "node_cap")) == (1, 1)  # counted once stored
    assert it.metrics.value("rtt_worker_messages_out_total", topic="dead-letters") == 2


async def test_a_checkpoint_stores_the_dead_letters_before_the_positions_past_them(tmp_path: Path) -> None:
    handled: list[str] = []
    it, producer = intake(tmp_path, handled, refuse="t2")
    in_one_step(it, MIXED)
    assert dead_count(it, "invalid_json") == 0  # not stored yet
    table = changelog()
    await checkpoint(it, table)
    assert producer.topics() == [DEAD, DEAD, CHANGELOG, CHANGELOG]  # dead letters, positions, marker
    assert decode_positions(table.data[b"0|positions"], 0) == {("task-completions", 0): 4}
    assert (dead_count(it, "invalid_json"), dead_count(it, "node_cap")) == (1, 1)


async def test_a_sender_that_fails_keeps_the_positions_from_being_stored(tmp_path: Path) -> None:
    """The broker away when the checkpoint runs: its flush raises, the positions stay unwritten, and the dead
    letter is kept and stored by the next checkpoint, ahead of the positions. A worker stopped in between
    restarts from the positions stored before the batch: it reads the batch again, and its dead letters are
    sent again (at least once), while its effects, in no stored checkpoint either, are applied once."""
    handled: list[str] = []
    it, producer = intake(tmp_path, handled)
    in_one_step(it, batch(Record(0, completion("t1")), Record(1, b"{")))
    producer.failures = [KafkaTimeoutError()]
    table = changelog()
    with pytest.raises(KafkaTimeoutError):
        await checkpoint(it, table)
    assert producer.log == [] and table.data == {}  # no positions: the batch is read again after a restart
    assert dead_count(it, "invalid_json") == 0
    assert it.metrics.value("rtt_worker_send_failures_total", topic="dead-letters", outcome="retried") == 1
    await checkpoint(it, table)
    assert producer.topics() == [DEAD, CHANGELOG, CHANGELOG]
    assert decode_positions(table.data[b"0|positions"], 0) == {("task-completions", 0): 2}
    assert dead_count(it, "invalid_json") == 1


async def test_an_intake_not_started_waits_for_its_dead_letters_before_its_positions_move() -> None:
    """Without a sender (an intake not started) nothing would flush the dead letters before a checkpoint."""
    class SlowDead:
        def __init__(self) -> None:
            self.gate = asyncio.Event()
            self.sent: list[tuple[int, str]] = []

        async def send_all(self, bad: list[tuple[Any, str, ContractError]]) -> None:
            await self.gate.wait()
            self.sent += [(m.offset, exc.reason) for m, _, exc in bad]

    dead = SlowDead()
    handled: list[str] = []
    it = PartitionIntake(S, {"task-completions": lambda c, p: handled.append(c["task_id"])}, dead,  # type: ignore[arg-type]
                         clock=ManualClock(3.0))
    it.assign({0}, {("task-completions", 0): 0})
    task = asyncio.create_task(it.process(batch(Record(0, completion("t1")), Record(1, b"{"))))
    await asyncio.sleep(0.01)
    assert not task.done() and it.positions_of() == {0: {"task-completions": 0}}
    dead.gate.set()
    assert await task == 2
    assert dead.sent == [(1, "invalid_json")] and it.positions_of() == {0: {"task-completions": 2}}
