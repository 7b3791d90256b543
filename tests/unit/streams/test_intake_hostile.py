"""A hostile message (nesting deeper than the stack, a number beyond a double, NaN) on an intake's topic goes to
dead letters with its reason; the messages around it are handled and the read position moves past it."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition
from test_intake import C, Dead, P, Record, completion, intake

NESTED = b'{"a":' + b"[" * 1000 + b"]" * 1000 + b"}"


@pytest.mark.parametrize(("raw", "reason"), [
    (NESTED, "schema"),
    (b'{"a":' + b"[" * 5000 + b"]" * 5000 + b"}", "invalid_json"),
    (b'{"task_id":' + b"9" * 5000 + b"}", "invalid_json"),
    (b'{"rtt_ms":NaN}', "invalid_json"),
    (b'{"node":"\xff"}', "invalid_json"),
])
def test_a_hostile_completion_is_dead_lettered_and_the_batch_goes_on(raw: bytes, reason: str) -> None:
    handled: list[tuple[str, int]] = []
    dead = Dead()
    it = intake(handled, dead)
    it.assign({0}, {})
    batch = {TopicPartition(C, 0): [Record(0, completion("t1")), Record(1, raw), Record(2, completion("t2"))]}
    assert asyncio.run(it.process(batch)) == 3  # type: ignore[arg-type]
    assert handled == [("t1", 0), ("t2", 0)]
    assert dead.sent == [(1, "task-completions", reason)]
    assert it.positions_of() == {0: {"task-completions": 3}}


def test_a_deeply_nested_prediction_is_dead_lettered() -> None:
    dead = Dead()
    it = intake([], dead)
    it.assign({0}, {})
    asyncio.run(it.process({TopicPartition(P, 0): [Record(4, NESTED, topic=P)]}))  # type: ignore[dict-item]
    assert dead.sent == [(4, "rtt-predictions", "schema")]
    assert it.positions_of() == {0: {"rtt-predictions": 5}}
