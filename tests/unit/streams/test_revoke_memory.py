"""What a worker keeps of the partitions a rebalance takes from it: nothing, and the changelog gives it all back.

Checkpoints write rows into the tables' in-memory data themselves; Faust's memory store forgets, once a
recovery ends, only the keys it read from a changelog. The rows of lost partitions stayed in memory at
every rebalance (100,000 join entries, ~28 MiB; ~213 KB of window rows per node), and so did the class of
every node moved away.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import faust
import orjson
from faust.types import TP

from app.clock import ManualClock
from app.config import Settings
from app.drift.joinbuffer import JoinBuffer
from app.streams.bounds import Bounds
from app.streams.changelog import MARKER_KEY, _apply
from app.streams.feedback_options import FeedbackOptions
from app.streams.feedback_state import FeedbackLoop
from app.streams.feedback_table import FeedbackTable, feedback_table, parse_row_key
from app.streams.node_state import node_of_key
from app.streams.node_table import NodeStore, node_state_table, positions_key
from app.streams.options import WorkerOptions

OWNERSHIP = "ownership"
NODES = {"gpu-0": 0, "gpu|0b": 0, "gpu-1": 1, "gpu-1b": 1}  # node -> its partition


class Sender:
    """The intake's batch sender: what reaches each changelog partition, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, bytes, bytes | None]] = []

    def add(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
        assert key is not None
        self.sent.append((partition, key, value))

    async def flush(self) -> int:
        return len(self.sent)

    def take_rewound(self, topic: str) -> set[int]:
        return set()

    def changelog(self, partition: int) -> dict[bytes, bytes | None]:
        """The rows of ``partition`` a recovery replays (latest value per key, the markers left out)."""
        return {k: v for p, k, v in self.sent if p == partition and k != MARKER_KEY}


class Intake:
    """The intake as checkpoints and rebalances see it: read positions per partition and a live sender."""

    def __init__(self, partitions: set[int]) -> None:
        self.positions = {p: {"task-completions": 10 + p} for p in partitions}
        self.live_sender = Sender()

    def position_rows(self, key: Callable[[int], bytes], partitions: set[int] | None = None) -> list[Any]:
        return [(p, key(p), orjson.dumps(pos)) for p, pos in sorted(self.positions.items())
                if partitions is None or p in partitions]

    def positions_stored(self, rows: list[Any]) -> int:
        return 0

    def positions_held(self, rows: list[Any], data: Any) -> int:
        return 0

    def release(self, partitions: set[int]) -> None:
        pass

    def forget(self, partitions: set[int]) -> None:
        for p in partitions:
            self.positions.pop(p, None)

    def assign(self, partitions: set[int], offsets: dict[tuple[str, int], int]) -> None:
        for (name, p), off in offsets.items():
            self.positions.setdefault(p, {})[name] = off


def app_for(tmp_path: Path) -> faust.App:
    return faust.App(f"t-{tmp_path.name}", broker="kafka://127.0.0.1:1", store="memory://", datadir=str(tmp_path))


def row_partition(key: bytes) -> int | None:
    parsed = parse_row_key(key)
    return parsed[0] if parsed is not None else None


def revoked(partitions: set[int]) -> set[TP]:
    return {TP(OWNERSHIP, p) for p in partitions}


def rows_of(data: Any, partition_of: Callable[[bytes], int | None], partition: int) -> dict[bytes, bytes]:
    return {k: v for k, v in data.items() if partition_of(k) == partition}


def feedback_loop(table: FeedbackTable | Any, clock: ManualClock) -> FeedbackLoop:
    settings = Settings()
    return FeedbackLoop(settings, FeedbackOptions(), clock,
                        SimpleNamespace(store=NodeStore(10.0, WorkerOptions(), 1.0)),  # type: ignore[arg-type]
                        None, JoinBuffer(600.0, clock=clock), table)  # type: ignore[arg-type]


async def test_a_revoke_leaves_no_feedback_row_of_a_lost_partition_in_memory(tmp_path: Path) -> None:
    clock = ManualClock(1000.0)
    table = feedback_table(app_for(tmp_path), "feedback", OWNERSHIP, 4)
    loop = feedback_loop(table, clock)
    loop.intake = intake = Intake({0, 1})  # type: ignore[assignment]
    loop.held = {0, 1}
    table.on_revoke, table.on_restore = loop.revoke, loop.restore
    for node, partition in NODES.items():
        loop.partitions[node] = partition
        loop.node_class[node] = "gpu"
        for i in range(20):
            loop.tracker(node).add("gCTF", 100.0, 110.0 + i)
            loop.buffer.add_prediction((f"task-{i}", node), {"predicted_rtt_ms": 100.0 + i})
        loop.tracker(node).close(clock.now())
        loop.dirty_nodes.add(node)
    await loop.checkpoint()
    before = {p: rows_of(table.data, row_partition, p) for p in (0, 1)}
    trackers = {n: orjson.dumps(t.to_dict()) for n, t in loop.trackers.items()}
    assert all(len(rows) == 2 * 20 + 2 + 1 for rows in before.values())  # join entries, trackers, positions

    await table.on_rebalance(set(), revoked({0}), set())
    assert rows_of(table.data, row_partition, 0) == {}
    assert rows_of(table.data, row_partition, 1) == before[1]
    assert sorted(loop.partitions) == sorted(loop.trackers) == sorted(loop.node_class) == ["gpu-1", "gpu-1b"]

    # the partition comes back: its changelog holds every row that left memory
    for key, value in intake.live_sender.changelog(0).items():
        _apply(table.data, key, value)
    assert rows_of(table.data, row_partition, 0) == before[0]
    changelog = table.changelog_topic.get_topic_name()
    await table.on_recovery_completed({TP(changelog, 0), TP(changelog, 1)}, set())
    assert {n: orjson.dumps(t.to_dict()) for n, t in loop.trackers.items()} == trackers
    assert sorted(loop.partitions.items()) == sorted(NODES.items())
    assert len(loop.buffer) == 20 * len(NODES)


async def test_a_revoke_leaves_no_node_window_row_of_a_lost_partition_in_memory(tmp_path: Path) -> None:
    store = NodeStore(30.0, WorkerOptions(), 1.0)
    table = node_state_table(app_for(tmp_path), "node-window", store, OWNERSHIP, 4)
    table.intake = intake = Intake({0, 1})  # type: ignore[assignment]
    for node, partition in NODES.items():
        state = store.state(node, partition, table.data.get)
        for t in range(60):
            state.update({"node": node, "ts": 1000.0 + t, "node_class": "gpu", "gpu_model": "Tesla M40",
                          "metrics": {f"metric_{j}": float(t + j) for j in range(5)}}, partition=partition)
    await table.checkpoint()
    positions = {positions_key(p): p for p in (0, 1)}

    def partition_of(key: bytes) -> int | None:
        return positions.get(key, NODES.get(node_of_key(key)))

    before = {p: rows_of(table.data, partition_of, p) for p in (0, 1)}
    features = {n: s.features_value() for n, s in store.states.items()}
    assert all(len(rows) == 2 * (60 + 1) + 1 for rows in before.values())  # ring slots and meta, positions

    await table.on_rebalance(set(), revoked({0}), set())
    assert rows_of(table.data, partition_of, 0) == {}
    assert rows_of(table.data, partition_of, 1) == before[1]
    assert sorted(store.states) == ["gpu-1", "gpu-1b"]

    # the partition comes back: its changelog holds every row that left memory, and rebuilds its nodes
    for key, value in intake.live_sender.changelog(0).items():
        _apply(table.data, key, value)
    assert rows_of(table.data, partition_of, 0) == before[0]
    for node, partition in NODES.items():
        assert store.state(node, partition, table.data.get).features_value() == features[node]


async def test_a_revoke_forgets_the_class_of_every_node_moved_away() -> None:
    """Rounds of nodes that come, move away in a rebalance and are forgotten by the caps: nothing stays."""

    class Rows:
        async def write(self, rows: Any, **_kw: Any) -> int:
            return len(list(rows))

    clock = ManualClock(1e9)
    loop = feedback_loop(Rows(), clock)
    bounds = Bounds(5000, 64)
    for r in range(3):
        for i in range(100):  # what the join does for a node's sample (on_completion, emit_sample)
            node = f"r{r}-node-{i}"
            bounds.admit_node(node, clock.monotonic())
            loop.partitions[node] = 0
            loop.node_class[node] = "gpu"
            loop.tracker(node).count_sample("gCTF")
        await loop.revoke({0})
        held = set(loop.partitions)  # the eviction timer: nodes not held leave the caps
        bounds.forget_nodes([n for n in bounds.nodes if n not in held])
    assert loop.trackers == {} and loop.partitions == {} and bounds.nodes == {}
    assert loop.node_class == {}


def test_dropping_rows_keeps_those_of_other_partitions_and_keys_of_none() -> None:
    from app.streams.changelog import drop_partitions

    data = {b"0|j|n|t": b"1", b"1|j|n|t": b"2", b"2|n|n": b"3", MARKER_KEY: b"1", b"0|o|": b"{}"}
    assert drop_partitions(data, {0, 2}, row_partition) == 3
    assert data == {b"1|j|n|t": b"2", MARKER_KEY: b"1"}
