"""``rtt_worker_messages_in_total`` counts a message once its effect is durable: when the checkpoint that stores a
read position past it is stored. It used to count a message as soon as it was processed, so after a crash between
two checkpoints the messages read since the last one were read and counted again."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError
from intake_standins import Record

from app.clock import ManualClock
from app.config import Settings
from app.drift.joinbuffer import JoinBuffer
from app.streams.changelog import Row
from app.streams.feedback_models import ModelCache
from app.streams.feedback_options import FeedbackOptions
from app.streams.feedback_state import FeedbackLoop
from app.streams.intake import PartitionIntake, decode_positions
from app.streams.node_table import NodeStore
from app.streams.options import WorkerOptions

S = Settings.from_env({}, topic_prefix="u-")
C = S.topic("task-completions")
TP = TopicPartition(C, 0)


class Dead:
    async def send_all(self, bad: list[Any]) -> None: ...


class Table:
    """The feedback table as a checkpoint sees it: stores the position rows, or fails while ``fail``."""

    def __init__(self) -> None:
        self.positions: dict[bytes, bytes] = {}
        self.data = self.positions  # the rows it holds: those stored
        self.fail = False

    async def write(self, rows: list[Any], *, last: list[Row] = (),  # type: ignore[assignment]
                    sender: object = None, held: object = None) -> int:
        if self.fail:
            raise KafkaTimeoutError()
        for _, key, value in last:
            assert value is not None
            self.positions[key] = value
        return len(rows) + len(last)


def completion(task: str) -> bytes:
    return orjson.dumps({"task_id": task, "app": "gCTF", "node": "n1", "submitted_ts": 0.5, "started_ts": 1.0,
                         "finished_ts": 2.0, "rtt_ms": 1000.0, "status": "ok"})


def batch(first: int, last: int) -> dict[TopicPartition, list[Record]]:
    return {TP: [Record(o, completion(f"t{o}")) for o in range(first, last + 1)]}


def intake() -> PartitionIntake:
    """A fresh intake in a fresh registry (a process of its own)."""
    return PartitionIntake(S, {"task-completions": lambda _v, _p: None}, Dead())  # type: ignore[arg-type]


def counted(it: PartitionIntake) -> float:
    return it.metrics.value("rtt_worker_messages_in_total", topic="task-completions")


def worker(table: Table, it: PartitionIntake) -> FeedbackLoop:
    clock = ManualClock(3.0)
    loop = FeedbackLoop(S, FeedbackOptions(), clock, SimpleNamespace(store=NodeStore(10.0, WorkerOptions(), 1.0)),
                        ModelCache(S), JoinBuffer(60.0, clock=clock), table)  # type: ignore[arg-type]
    loop.intake = it
    return loop


def test_messages_read_again_after_a_crash_are_counted_once() -> None:
    table = Table()
    first = intake()
    loop = worker(table, first)
    first.assign({0}, {})
    asyncio.run(first.process(batch(0, 2)))  # type: ignore[arg-type]
    assert counted(first) == 0  # processed, but nothing of them is durable yet
    asyncio.run(loop.checkpoint())
    assert counted(first) == 3
    asyncio.run(first.process(batch(3, 4)))  # type: ignore[arg-type]
    table.fail = True  # the broker away: the checkpoint is not stored, then the worker is killed
    with pytest.raises(KafkaTimeoutError):
        asyncio.run(loop.checkpoint())
    assert counted(first) == 3

    table.fail = False
    second = intake()  # the restarted worker restores the stored positions and reads 3 and 4 again, then 5
    loop = worker(table, second)
    second.assign({0}, {k: v for raw in table.positions.values() for k, v in decode_positions(raw, 0).items()})
    assert second.positions_of() == {0: {"task-completions": 3}}
    asyncio.run(second.process(batch(3, 5)))  # type: ignore[arg-type]
    assert counted(second) == 0
    asyncio.run(loop.checkpoint())
    assert counted(first) + counted(second) == 6  # offsets 0..5, each counted once (it used to be 3 + 2 + 3 = 8)


def test_a_checkpoint_counts_the_messages_its_positions_cover_only() -> None:
    it = intake()
    it.assign({0, 1}, {})
    asyncio.run(it.process(batch(0, 4)))  # type: ignore[arg-type]
    rows = it.position_rows(lambda p: f"{p}|positions".encode())
    asyncio.run(it.process(batch(5, 6)))  # type: ignore[arg-type]  # read while the checkpoint is written
    assert it.positions_stored(rows) == 5 and counted(it) == 5
    assert it.positions_stored(rows) == 0  # stored again: nothing more

    # the topic recreated: the position is reset to its new start; what was read before is in the state the next
    # checkpoint stores, with the new position
    it._reset({TP: 0})
    asyncio.run(it.process(batch(0, 0)))  # type: ignore[arg-type]
    assert it.positions_stored(it.position_rows(lambda p: f"{p}|positions".encode())) == 3 and counted(it) == 8

    # a partition lost before its messages were stored (its last checkpoint failed): its new owner counts them
    asyncio.run(it.process(batch(1, 2)))  # type: ignore[arg-type]
    it.release({0})
    it.forget({0})
    assert it.positions_stored(it.position_rows(lambda p: f"{p}|positions".encode())) == 0 and counted(it) == 8
