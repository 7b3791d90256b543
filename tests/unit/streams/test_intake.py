"""PartitionIntake's bookkeeping: what it owns, where it reads from, what a batch does to its positions."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError
from intake_standins import Record
from prometheus_client import CollectorRegistry

from app.clock import ManualClock
from app.config import Settings
from app.errors import ContractError
from app.kafka.positions import PositionGuard
from app.streams import intake as intake_module
from app.streams.intake import PartitionIntake

S = Settings.from_env({}, topic_prefix="u-")
C, P = S.topic("task-completions"), S.topic("rtt-predictions")


class Dead:
    def __init__(self) -> None:
        self.sent: list[tuple[int, str, str]] = []

    async def send_all(self, bad: list[tuple[Any, str, ContractError]]) -> None:
        self.sent.extend((message.offset, source, exc.reason) for message, source, exc in bad)


def completion(task: str, node: str = "n1") -> bytes:
    return orjson.dumps({"task_id": task, "app": "gCTF", "node": node, "submitted_ts": 0.5, "started_ts": 1.0,
                         "finished_ts": 2.0,
                         "rtt_ms": 1000.0, "status": "ok"})


def intake(handled: list[tuple[str, int]], dead: Dead, fail_on: str = "") -> PartitionIntake:
    def on_completion(c: dict[str, Any], partition: int) -> None:
        if c["task_id"] == fail_on:
            raise RuntimeError("boom")
        handled.append((c["task_id"], partition))

    return PartitionIntake(S, {"task-completions": on_completion, "rtt-predictions": lambda p, n: None},
                           dead, clock=ManualClock(3.0))  # type: ignore[arg-type]


def test_assign_release_forget() -> None:
    it = intake([], Dead())
    it.assign({0, 3}, {("task-completions", 0): 42})
    assert it.owned == {0, 3}
    assert it.positions_of() == {0: {"task-completions": 42}}
    # positions of a partition still held are not moved back by a later assignment
    it.positions[TopicPartition(C, 0)] = 50
    it.assign({0, 5}, {("task-completions", 0): 42})
    assert it.positions_of({0}) == {0: {"task-completions": 50}} and it.owned == {0, 3, 5}
    it.release({0})
    assert it.owned == {3, 5}
    assert it.positions_of({0}) == {0: {"task-completions": 50}}  # still there for the last checkpoint
    it.forget({0})
    assert it.positions_of() == {}


def test_a_batch_moves_positions_and_dead_letters_bad_messages() -> None:
    handled: list[tuple[str, int]] = []
    dead = Dead()
    it = intake(handled, dead, fail_on="t-boom")
    it.assign({0, 1}, {})
    batch = {
        TopicPartition(C, 0): [Record(10, completion("t-1")), Record(11, b"{not json"), Record(12, completion("t-2"))],
        TopicPartition(C, 1): [Record(7, completion("t-boom"), partition=1), Record(8, completion("t-3"), partition=1)],
        TopicPartition(C, 2): [Record(0, completion("t-not-mine"), partition=2)],  # not owned: skipped
    }
    n = asyncio.run(it.process(batch))  # type: ignore[arg-type]
    assert n == 5
    assert handled == [("t-1", 0), ("t-2", 0), ("t-3", 1)]
    assert dead.sent == [(11, "task-completions", "invalid_json"), (7, "task-completions", "processing_failed")]
    assert it.positions_of() == {0: {"task-completions": 13}, 1: {"task-completions": 9}}


def test_a_partition_released_during_a_batch_keeps_its_position() -> None:
    handled: list[tuple[str, int]] = []
    it = intake(handled, Dead())
    it.assign({0}, {("task-completions", 0): 10})
    it.release({0})
    asyncio.run(it.process({TopicPartition(C, 0): [Record(10, completion("t-1"))]}))  # type: ignore[dict-item]
    assert handled == [] and it.positions_of() == {0: {"task-completions": 10}}


def test_key_and_time_checks_send_messages_to_dead_letters_with_their_reason() -> None:
    handled: list[tuple[str, int]] = []
    dead = Dead()
    it = intake(handled, dead)
    it.assign({0}, {})
    future = orjson.dumps({**orjson.loads(completion("t-future")), "finished_ts": 9.9e10})
    old = orjson.loads(completion("t-old"))
    batch = {TopicPartition(C, 0): [
        Record(1, completion("t-ok")), Record(2, completion("t-other"), key=b"n2"), Record(3, future),
        Record(4, completion("t-nokey"), key=None),
    ]}
    asyncio.run(it.process(batch))  # type: ignore[arg-type]
    assert handled == [("t-ok", 0)]
    assert dead.sent == [(2, "task-completions", "key_mismatch"), (3, "task-completions", "ts_in_future"),
                         (4, "task-completions", "key_mismatch")]
    it.clock = ManualClock(old["finished_ts"] + S.max_event_age_s + 1)
    asyncio.run(it.process({TopicPartition(C, 0): [Record(5, completion("t-old"))]}))  # type: ignore[dict-item]
    assert dead.sent[-1] == (5, "task-completions", "ts_too_old")


def test_a_completion_that_finished_before_it_started_is_dead_lettered() -> None:
    """Its time on the node is negative; `rttsched publish` and the span conversion refuse it as well."""
    handled: list[tuple[str, int]] = []
    dead = Dead()
    it = intake(handled, dead)
    it.assign({0}, {})
    backwards = orjson.dumps({**orjson.loads(completion("t-back")), "started_ts": 1.5, "finished_ts": 1.25})
    asyncio.run(it.process({TopicPartition(C, 0): [Record(1, backwards), Record(2, completion("t-ok"))]}))  # type: ignore[dict-item]
    assert handled == [("t-ok", 0)] and dead.sent == [(1, "task-completions", "finished_before_start")]


def test_a_handler_refusal_keeps_its_reason() -> None:
    dead = Dead()

    def refuse(c: dict[str, Any], partition: int) -> None:
        raise ContractError("node_cap", "full")

    it = PartitionIntake(S, {"task-completions": refuse}, dead, clock=ManualClock(3.0))  # type: ignore[arg-type]
    it.assign({0}, {})
    asyncio.run(it.process({TopicPartition(C, 0): [Record(1, completion("t-1"))]}))  # type: ignore[dict-item]
    assert dead.sent == [(1, "task-completions", "node_cap")]


class Held:
    """A sender holding ``n`` records the broker will not take."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.ships = 0

    def __len__(self) -> int:
        return self.n

    async def ship(self) -> int:
        self.ships += 1
        raise KafkaTimeoutError()


class Fetches:
    def __init__(self) -> None:
        self.calls = 0

    async def getmany(self, **kw: Any) -> dict[TopicPartition, list[Any]]:
        self.calls += 1
        return {}

    def assignment(self) -> set[TopicPartition]:
        return set()


async def test_reading_pauses_while_the_broker_takes_none_of_what_waits() -> None:
    """Producing fails while fetching works (an output topic gone): the intake used to go on reading, one batch
    per producer timeout, each one's records added to those waiting in memory."""
    it = intake([], Dead())
    it.owned = {0}
    consumer = Fetches()
    it._consumer = consumer  # type: ignore[assignment]
    it.sender = Held(intake_module.HELD_MAX)  # type: ignore[assignment]
    with pytest.raises(KafkaTimeoutError):
        await it._step()
    assert consumer.calls == 0 and it.sender.ships == 1  # type: ignore[attr-defined]
    it.sender.n = intake_module.HELD_MAX - 1  # type: ignore[attr-defined]
    it.guard = PositionGuard(consumer, "intake", registry=CollectorRegistry())  # type: ignore[arg-type]
    await it._step()
    assert consumer.calls == 1
