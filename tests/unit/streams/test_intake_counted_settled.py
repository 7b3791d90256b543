"""``rtt_worker_messages_in_total`` counts the messages a stored checkpoint covers, whatever happens around it.

* While checkpoints fail and reading goes on, the messages waiting to be counted used to take one entry per batch
  per partition, without limit (50,000 batches: 50,000 entries); past a bound the oldest entries are merged.
* A checkpoint in flight when its partitions are revoked (the node table had no lock: a periodic checkpoint and the
  revoke's ran at once), or whose read positions were stored and whose markers then failed, stored a position past
  messages that no worker counted: the revoke dropped the pending counts, and the new owner reads on from the
  stored position.
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
from intake_standins import Record
from test_revoke_memory import OWNERSHIP, app_for, revoked

from app.clock import ManualClock
from app.config import Settings
from app.drift.joinbuffer import JoinBuffer
from app.streams.changelog import MARKER_KEY, Row
from app.streams.context import attach
from app.streams.feedback_models import ModelCache
from app.streams.feedback_options import FeedbackOptions
from app.streams.feedback_state import FeedbackLoop
from app.streams.intake import PartitionIntake
from app.streams.node_table import NodeStore, node_state_table
from app.streams.options import WorkerOptions

S = Settings.from_env({}, topic_prefix="u-")
TP = TopicPartition(S.topic("task-completions"), 0)


class Dead:
    async def send_all(self, bad: list[Any]) -> None: ...


def completion(task: str) -> bytes:
    return orjson.dumps({"task_id": task, "app": "gCTF", "node": "n1", "submitted_ts": 0.5, "started_ts": 1.0,
                         "finished_ts": 2.0, "rtt_ms": 1000.0, "status": "ok"})


def batch(first: int, last: int) -> dict[TopicPartition, list[Record]]:
    return {TP: [Record(o, completion(f"t{o}")) for o in range(first, last + 1)]}


class Intake(PartitionIntake):
    """A real intake whose live sender is the test's."""

    test_sender: Any = None

    @property
    def live_sender(self) -> Any:
        return self.test_sender


def intake(sender: Any = None) -> Intake:
    it = Intake(S, {"task-completions": lambda _v, _p: None}, Dead())  # type: ignore[arg-type]
    it.test_sender = sender
    it.assign({0, 1}, {})
    return it


def counted(it: PartitionIntake) -> float:
    return it.metrics.value("rtt_worker_messages_in_total", topic="task-completions")


def key(p: int) -> bytes:
    return f"{p}|positions".encode()


async def test_the_pending_counts_stay_bounded_while_checkpoints_fail() -> None:
    it = intake()
    for o in range(5_000):  # one message a batch, no checkpoint stored meanwhile (before: 5,000 entries)
        await it.process({TP: [Record(o, completion(f"t{o}"))]})  # type: ignore[dict-item]
    assert len(it._uncounted[TP]) <= 100
    early = [(0, key(0), orjson.dumps({"task-completions": 10}))]  # a position past the first 10 messages only
    n = it.positions_stored(early)
    assert n <= 10  # delayed by the merge at most, never more than the position covers
    assert it.positions_stored(it.position_rows(key)) == 5_000 - n and counted(it) == 5_000
    assert TP not in it._uncounted


class Sender:
    """The intake's sender: a flush takes a few turns of the loop (the broker answering); one made by the task
    named ``revoke``, or one of the markers while ``markers_fail``, raises (the broker away)."""

    def __init__(self) -> None:
        self.pending: list[bytes | None] = []
        self.markers_fail = False

    def add(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
        self.pending.append(key)

    async def flush(self) -> int:
        keys, self.pending = self.pending, []
        task = asyncio.current_task()
        if task is not None and task.get_name() == "revoke":
            raise KafkaTimeoutError()
        if self.markers_fail and MARKER_KEY in keys:
            raise KafkaTimeoutError()
        for _ in range(5):
            await asyncio.sleep(0)
        return len(keys)

    def take_rewound(self, topic: str) -> set[int]:
        return set()

    def discard(self, topic: str, partitions: set[int]) -> int:
        return 0


def node_table(tmp_path: Path, sender: Sender) -> tuple[Any, Intake]:
    app = app_for(tmp_path)
    attach(app, Settings(), WorkerOptions())
    table = node_state_table(app, "node-window", NodeStore(30.0, WorkerOptions(), 1.0), OWNERSHIP, 4)
    table.intake = it = intake(sender)
    return table, it


async def test_a_checkpoint_in_flight_when_its_partition_is_revoked_counts_what_it_stores(tmp_path: Path) -> None:
    table, it = node_table(tmp_path, Sender())
    await it.process(batch(0, 4))  # type: ignore[arg-type]
    periodic = asyncio.ensure_future(table.checkpoint())  # the checkpoint timer: stores position 5 of partition 0
    await asyncio.sleep(0)
    revoke = asyncio.get_running_loop().create_task(table.on_rebalance(set(), revoked({0}), set()), name="revoke")
    assert await periodic == 1  # its write lands (before: after the revoke had dropped the pending counts)
    await revoke  # its own checkpoint failed (the broker away), logged and counted
    assert counted(it) == 5  # before: 0, and the new owner reads on from 5: counted by no worker
    assert 0 not in {tp.partition for tp in it.positions} and not it._uncounted


async def test_positions_stored_before_the_markers_failed_are_counted(tmp_path: Path) -> None:
    sender = Sender()
    table, it = node_table(tmp_path, sender)
    await it.process(batch(0, 4))  # type: ignore[arg-type]
    sender.markers_fail = True
    with pytest.raises(KafkaTimeoutError):
        await table.checkpoint()  # the position rows stored, the markers after them not
    assert counted(it) == 5  # before: 0; then the revoke dropped them, and the new owner reads on from 5
    await table.on_rebalance(set(), revoked({0}), set())
    assert counted(it) == 5
    sender.markers_fail = False
    await table.checkpoint()  # partition 1 goes on: nothing counted twice
    assert counted(it) == 5


class FeedbackTable:
    """The feedback table as a checkpoint sees it: stores the rows and the read positions, then its markers fail."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    async def write(self, rows: list[Any], *, last: list[Row] = (),  # type: ignore[assignment]
                    sender: object = None, held: object = None) -> int:
        for _, k, value in last:
            assert value is not None
            self.data[k] = value
        raise KafkaTimeoutError()  # the markers' flush


async def test_the_feedback_loop_counts_positions_stored_before_its_markers_failed() -> None:
    it = intake()
    clock = ManualClock(3.0)
    loop = FeedbackLoop(S, FeedbackOptions(), clock, SimpleNamespace(store=NodeStore(10.0, WorkerOptions(), 1.0)),
                        ModelCache(S), JoinBuffer(60.0, clock=clock), FeedbackTable())  # type: ignore[arg-type]
    loop.intake = it
    await it.process(batch(0, 4))  # type: ignore[arg-type]
    with pytest.raises(KafkaTimeoutError):
        await loop.checkpoint()
    assert counted(it) == 5  # before: 0, lost once the partition is revoked
