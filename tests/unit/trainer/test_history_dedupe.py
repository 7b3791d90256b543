"""The trainer's history keeps one row per task: a redelivered training sample is not counted twice."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.trainer.history import SampleHistory


def sample(task: str | None, node: str = "n1", ts: float = 1.0) -> dict[str, object]:
    return {"model_key": "gCTF:gpu", "task_id": task, "node": node, "node_class": "gpu", "gpu_model": "Tesla M40",
            "started_ts": ts, "rtt_ms": 100.0, "features": {"m__mean": ts}}


def test_a_task_is_held_once_per_node() -> None:
    h = SampleHistory()
    assert h.add(sample("t1")) and not h.add(sample("t1")) and h.add(sample("t1", node="n2"))
    assert h.count("gCTF:gpu") == 2


def test_a_task_that_fell_out_of_the_bound_may_come_back() -> None:
    h = SampleHistory(max_per_key=2)
    for t in ("t1", "t2", "t3"):
        assert h.add(sample(t))
    assert not h.add(sample("t3"))
    assert h.add(sample("t1"))  # t1 fell out when t3 came
    assert h.count("gCTF:gpu") == 2


@given(st.lists(st.sampled_from([f"t{i}" for i in range(12)]), max_size=80), st.integers(1, 10))
def test_rows_are_the_distinct_recent_tasks(tasks: list[str], bound: int) -> None:
    h = SampleHistory(max_per_key=bound)
    kept: list[tuple[str, float]] = []  # (task, when it was added), the newest ``bound``
    for i, t in enumerate(tasks):
        added = h.add(sample(t, ts=float(i)))
        assert added == (t not in {k for k, _ in kept})
        if added:
            kept = (kept + [(t, float(i))])[-bound:]
    assert h.count("gCTF:gpu") == len(kept)
    if kept:
        assert h.dataset("gCTF:gpu").ts.tolist() == [when for _, when in kept]
