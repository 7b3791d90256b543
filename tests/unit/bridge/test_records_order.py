"""A task-completions line that finished before it started is refused by `rttsched publish`, as a span that ends
before it starts is: it used to be published, and the worker learnt a negative time on the node from it."""

from __future__ import annotations

import orjson

from app.bridge.records import Record, convert

DONE = {"task_id": "t1", "app": "gCTF", "node": "gpu-1", "submitted_ts": 100.0, "started_ts": 101.0,
        "finished_ts": 103.0, "rtt_ms": 3000.0, "status": "ok"}


def converted(value: dict[str, object]) -> tuple[int, list[str]]:
    raw = orjson.dumps(value)
    out = convert(Record(7, raw, orjson.loads(raw)), "task-completions")
    return len(out.values), [f"{p.line}: {p.error}" for p in out.problems]


def test_finished_before_started_is_a_problem_with_its_reason() -> None:
    assert converted(DONE) == (1, [])
    assert converted({**DONE, "finished_ts": 100.5}) == (
        0, ["7: finished_before_start: finished_ts 100.5 is 0.5 s before started_ts 101.0"])
