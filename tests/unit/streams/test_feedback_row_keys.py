"""The feedback table's row keys keep every node apart, whatever its name, across a checkpoint and a restore.

The contracts accept any node name of 1-253 characters, ``|`` and ``%`` included; ``|`` also separates a row
key's fields. A node ``gpu|r1`` once came back from the changelog as node ``gpu``, its tracker and join
entries on another node (or two such nodes on one).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import orjson
from hypothesis import example, given
from hypothesis import strategies as st

from app.clock import ManualClock
from app.config import Settings
from app.drift.joinbuffer import JoinBuffer
from app.registry.directory import DirectoryModelStore
from app.streams.feedback_models import ModelCache
from app.streams.feedback_options import FeedbackOptions
from app.streams.feedback_state import FeedbackLoop
from app.streams.feedback_table import join_row_key, node_row_key, parse_row_key
from app.streams.node_table import NodeStore
from app.streams.options import WorkerOptions

NAMES = st.text(st.sampled_from("ab|%7C25-."), min_size=1, max_size=12) | st.text(min_size=1, max_size=20)
PARTITIONS = st.integers(0, 63)


@given(PARTITIONS, NAMES, NAMES)
def test_a_row_key_gives_back_its_partition_node_and_task(partition: int, node: str, task_id: str) -> None:
    assert parse_row_key(join_row_key(partition, node, task_id)) == (partition, "j", node, task_id)
    assert parse_row_key(node_row_key(partition, node)) == (partition, "n", node, "")


@given(st.tuples(PARTITIONS, NAMES, NAMES), st.tuples(PARTITIONS, NAMES, NAMES))
@example((0, "gpu|r1", "t"), (0, "gpu", "r1|t"))
@example((0, "a%7Cb", "t"), (0, "a|b", "t"))
def test_two_rows_share_a_key_only_when_they_are_the_same_row(a: tuple[int, str, str],
                                                              b: tuple[int, str, str]) -> None:
    assert (join_row_key(*a) == join_row_key(*b)) == (a == b)
    assert (node_row_key(*a[:2]) == node_row_key(*b[:2])) == (a[:2] == b[:2])
    assert join_row_key(*a) != node_row_key(*b[:2])


def test_names_without_a_bar_or_a_percent_sign_are_written_as_they_are() -> None:
    """Rows a worker stored before are read back the same."""
    assert join_row_key(3, "gpu-1", "task|7") == b"3|j|gpu-1|task|7"
    assert node_row_key(5, "worker-2.rack") == b"5|n|worker-2.rack"
    assert parse_row_key(b"3|j|gpu-1|task|7") == (3, "j", "gpu-1", "task|7")
    assert join_row_key(0, "gpu|r1", "t") != join_row_key(0, "gpu", "r1|t")


def make_loop(tmp_path: Path, clock: ManualClock) -> FeedbackLoop:
    settings = Settings()
    nodes = NodeStore(10.0, WorkerOptions(), 1.0)
    return FeedbackLoop(settings, FeedbackOptions(), clock, SimpleNamespace(store=nodes),  # type: ignore[arg-type]
                        ModelCache(settings, store=DirectoryModelStore(tmp_path)), JoinBuffer(60.0, clock=clock),
                        None)  # type: ignore[arg-type]


class Table:
    """What a checkpoint writes: the changelog, as the worker taking over the partition recovers it."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    async def write(self, rows: list[tuple[bytes, bytes | None]], **_kw: object) -> int:
        for key, value in rows:
            if value is None:
                self.data.pop(key, None)
            else:
                self.data[key] = value
        return len(rows)


def test_a_restore_keeps_nodes_whose_names_differ_by_a_bar_apart(tmp_path: Path) -> None:
    """Node ``gpu|r1`` (task ``t``) and node ``gpu`` (task ``r1|t``): checkpointed by one worker, restored by
    the next, each tracker and join entry on its own node."""
    clock = ManualClock(1000.0)
    before = make_loop(tmp_path, clock)
    before.table = Table()  # type: ignore[assignment]
    samples = {"gpu|r1": 3, "gpu": 5, "50%|x": 2}
    for node, n in samples.items():
        before.partitions[node] = 0
        for _ in range(n):
            before.tracker(node).add("gCTF", 110.0, 100.0)
        before.tracker(node).close(clock.now())
        before.dirty_nodes.add(node)
    before.buffer.add_prediction(("t", "gpu|r1"), {"predicted_rtt_ms": 100.0})
    before.buffer.add_prediction(("r1|t", "gpu"), {"predicted_rtt_ms": 200.0})
    asyncio.run(before.checkpoint())

    after = make_loop(tmp_path, clock)
    after.restore(dict(before.table.data), {0})  # type: ignore[attr-defined]
    assert sorted(after.trackers) == sorted(samples)
    assert after.partitions == {node: 0 for node in samples}
    states = {node: orjson.dumps(after.trackers[node].to_dict()) for node in samples}
    assert states == {node: orjson.dumps(before.trackers[node].to_dict()) for node in samples}
    assert len(set(states.values())) == len(samples)  # three different trackers, each on its own node
    assert sorted(after.buffer.keys()) == [("r1|t", "gpu"), ("t", "gpu|r1")]
