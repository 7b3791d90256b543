"""A batch's dead letters are stored before any of it is applied, so a checkpoint never sees the batch's effects
with the read positions from before it (a restart would apply it twice); a send that fails loses nothing."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition

from app.clock import ManualClock
from app.config import Settings
from app.contracts import decode
from app.errors import ContractError
from app.streams.intake import PartitionIntake

S = Settings.from_env({"RTT_METRICS_PORT": "0"}, topic_prefix="u-")
C = S.topic("task-completions")


@dataclasses.dataclass
class Record:
    offset: int
    value: bytes
    topic: str = C
    partition: int = 0
    key: bytes | None = b"n1"


def completion(task: str) -> bytes:
    return orjson.dumps({"task_id": task, "app": "gCTF", "node": "n1", "submitted_ts": 0.5, "started_ts": 1.0,
                         "finished_ts": 2.0, "rtt_ms": 1000.0, "status": "ok"})


class SlowDead:
    """Stores dead letters once ``gate`` is set; ``fail``: raise instead (the producer refused them at once)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.fail: BaseException | None = None
        self.sent: list[tuple[int, str]] = []

    async def send_all(self, bad: list[tuple[Any, str, ContractError]]) -> None:
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        self.sent += [(m.offset, exc.reason) for m, _, exc in bad]


class Consumer:
    def __init__(self) -> None:
        self.seeks: list[tuple[TopicPartition, int]] = []

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))


def intake(handled: list[str], dead: Any, refuse: str = "", metrics: Any = None) -> PartitionIntake:
    def on_completion(c: dict[str, Any], partition: int) -> None:
        if c["task_id"] == refuse:
            raise ContractError("node_cap", "full")
        handled.append(c["task_id"])

    it = PartitionIntake(S, {"task-completions": on_completion}, dead, clock=ManualClock(3.0), metrics=metrics)
    it.assign({0}, {("task-completions", 0): 0})
    return it


def batch(*records: Record) -> dict[TopicPartition, list[Any]]:
    return {TopicPartition(C, 0): list(records)}


async def test_no_message_of_the_batch_is_applied_while_its_dead_letters_are_awaited() -> None:
    handled: list[str] = []
    dead = SlowDead()
    it = intake(handled, dead)
    task = asyncio.create_task(it.process(batch(Record(0, completion("t1")), Record(1, b"{"),
                                                Record(2, completion("t2")))))
    await asyncio.sleep(0.01)
    # what a checkpoint taken now records: no effect of the batch, and the positions from before it
    assert not task.done()
    assert handled == [] and it.positions_of() == {0: {"task-completions": 0}}
    dead.gate.set()
    assert await task == 3
    assert handled == ["t1", "t2"] and dead.sent == [(1, "invalid_json")]
    assert it.positions_of() == {0: {"task-completions": 3}}


async def test_a_dead_letter_send_that_fails_reads_the_batch_again() -> None:
    handled: list[str] = []
    dead = SlowDead()
    dead.fail = RuntimeError("producer refused at once")
    dead.gate.set()
    it = intake(handled, dead)
    consumer = Consumer()
    it._consumer = consumer  # type: ignore[assignment]
    records = batch(Record(4, completion("t1")), Record(5, b"{"), Record(6, completion("t2")))
    with pytest.raises(RuntimeError):
        await it.process(records)
    # nothing applied, the positions where they were, and the consumer back at the batch's first message
    assert handled == [] and it.positions_of() == {0: {"task-completions": 0}}
    assert consumer.seeks == [(TopicPartition(C, 0), 4)]
    dead.fail = None
    assert await it.process(records) == 3  # read again: the bad message reaches dead-letters after all
    assert handled == ["t1", "t2"] and dead.sent == [(5, "invalid_json")]
    assert it.positions_of() == {0: {"task-completions": 7}}


async def test_a_partition_released_while_its_dead_letters_are_awaited_is_left_to_its_new_owner() -> None:
    handled: list[str] = []
    dead = SlowDead()
    it = intake(handled, dead)
    task = asyncio.create_task(it.process(batch(Record(0, completion("t1")), Record(1, b"{"))))
    await asyncio.sleep(0.01)
    it.release({0})  # a rebalance; its last checkpoint records what was applied: nothing of this batch
    dead.gate.set()
    await task
    assert handled == [] and it.positions_of() == {0: {"task-completions": 0}}


class Sender:
    def __init__(self) -> None:
        self.added: list[tuple[str, int, bytes | None, bytes | None]] = []

    def __len__(self) -> int:
        return len(self.added)

    def add(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
        self.added.append((topic, partition, key, value))


async def test_a_handler_s_refusal_goes_out_with_the_batch_s_outputs_and_counts_once_delivered(tmp_path: Path) -> None:
    """A refusal is known only once its handler ran: its dead letter is handed to the intake's sender, which
    every checkpoint flushes before it writes the read positions, in the same step as the positions move."""
    from app.streams.app import create_app
    from app.streams.deadletter import DeadLetters
    from app.streams.options import WorkerOptions

    app = create_app(S, id="dead-order", options=WorkerOptions.from_settings(S, datadir=str(tmp_path)))
    dead = DeadLetters(app, S)
    sent_all: list[Any] = []

    async def send_all(bad: list[Any]) -> None:
        sent_all.append(bad)
        await asyncio.sleep(0.01)  # a broker round trip, during which a checkpoint may run

    dead.send_all = send_all  # type: ignore[method-assign]
    handled: list[str] = []
    it = intake(handled, dead, refuse="t2", metrics=dead.metrics)
    it.sender = sender = Sender()  # type: ignore[assignment]
    assert await it.process(batch(Record(0, completion("t1")), Record(1, completion("t2")),
                                  Record(2, completion("t3")))) == 3
    assert sent_all == []  # nothing awaited between the handlers and the positions
    assert handled == ["t1", "t3"] and it.positions_of() == {0: {"task-completions": 3}}
    [(topic, partition, key, value)] = sender.added
    letter = decode("dead-letters", value)
    assert (topic, partition, key) == ("u-dead-letters", 0, C.encode())
    assert (letter["topic"], letter["offset"], letter["reason"]) == (C, 1, "node_cap")
    counted = ("rtt_worker_dead_letters_total", {"topic": "task-completions", "reason": "node_cap"})
    assert dead.metrics.value(counted[0], **counted[1]) == 0  # counted once the broker has it
    it._delivered("u-dead-letters", 1)
    assert dead.metrics.value(counted[0], **counted[1]) == 1 and dead.sent == 1
    assert dead.metrics.value("rtt_worker_messages_out_total", topic="dead-letters") == 1
