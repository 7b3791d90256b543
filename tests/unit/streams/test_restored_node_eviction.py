"""A node restored from a checkpoint (a restart, a partition taken over) that no message names again is evicted
after RTT_NODE_EVICT_AFTER_S, counted from when the worker found it so: its tracker and window rows leave memory
and the changelogs, and node-features and node-weights get its tombstones (app.streams.eviction). A restored node
heard of again stays; one heard of again only through the join (predictions, no node-metrics: no window state in
memory) takes its restored window rows with it once it goes silent. A restored node of a partition revoked before
the delay is left to its new owner.

Before, only nodes named by a message since the process started could be evicted, and only a node with a window
state in memory had its window rows deleted: a node that left the cluster within the eviction delay before a
restart or a rebalance kept its tracker, its window rows (in memory and in the changelog) and its last
node-features and node-weights values for ever.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import faust.topics
import orjson
import pytest
from faust.types import TP

import app.streams.eviction as eviction
from app.clock import ManualClock
from app.config import Settings
from app.contracts import contract, decode, encode
from app.drift.tracker import NodeTracker
from app.kafka.batches import partition_for
from app.streams.app import create_app
from app.streams.context import context_of
from app.streams.feedback_state import FeedbackLoop
from app.streams.feedback_table import node_row_key
from app.streams.node_state import NodeState, node_of_key
from app.streams.options import WorkerOptions

AFTER_S = 60.0
P = 3  # the partition of the restored nodes
MOVED_P = 5  # a partition restored, then revoked before the delay


class Sender:
    """The intakes' batch sender (changelog rows, node-features): what they would send."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, bytes | None, bytes | None]] = []

    def add(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
        self.sent.append((topic, partition, key, value))

    async def ship(self) -> int:
        return 0


class Worker:
    """A restarted worker's components on a manual clock: its eviction tick run by hand, its sends recorded."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        ticks: dict[str, Any] = {}

        def timer(app: faust.App, interval_s: float, name: str) -> Any:
            def register(fun: Any) -> Any:
                ticks[name] = fun
                return fun
            return register

        self.weights: list[tuple[str, bytes | None]] = []  # node-weights sends: node, value

        async def send(topic: faust.topics.Topic, *, key: bytes | None = None, value: bytes | None = None,
                       **_kw: Any) -> asyncio.Future[Any]:
            assert topic.get_topic_name() == self.settings.topic("node-weights") and key is not None
            self.weights.append((key.decode(), value))
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            fut.set_result(object())
            return fut

        monkeypatch.setattr(eviction, "timer", timer)
        monkeypatch.setattr(faust.topics.Topic, "send", send)
        self.settings = Settings(metrics_port=0, models_dir=str(tmp_path / "models"), node_evict_after_s=AFTER_S)
        self.clock = ManualClock(1000.0)
        app = create_app(self.settings, id=f"t-{tmp_path.name}", clock=self.clock,
                         options=dataclasses.replace(WorkerOptions(), datadir=str(tmp_path / "faust")))
        self.ctx = context_of(app)
        self.tick = ticks["evict-silent"]
        self.loop: FeedbackLoop = self.ctx.handles["feedback"]
        self.nodes = self.ctx.handles["node_features"]
        self.sender = Sender()
        self.nodes.intake.sender = self.loop.intake.sender = self.sender  # type: ignore[union-attr]
        self.nodes.intake._producer = object()  # running: the eviction tick does its work
        self.table = self.nodes.table
        self.changelog = self.table.changelog_topic.get_topic_name()
        self.rows: list[tuple[bytes, bytes | None]] = []  # the feedback table's changelog writes

        async def write(rows: Any, **_kw: Any) -> int:
            rows = list(rows)
            self.rows += rows
            return len(rows)

        self.loop.table.write = write  # type: ignore[method-assign]
        self.task = 0

    def window_rows(self, node: str) -> dict[bytes, bytes]:
        """The window rows the node's last checkpoint (before the restart) left in the changelog."""
        o = self.nodes.store.options
        s = NodeState.new(node, P, window_s=self.settings.feature_window_s, history_s=o.history_s,
                          bucket_s=o.bucket_s, max_metrics=o.max_metrics)
        for i in range(3):
            s.update({"node": node, "ts": self.clock.now() - 30.0 + i, "node_class": "gpu", "gpu_model": "Tesla M40",
                      "metrics": {"nvidia_smi_utilization_gpu": 0.4}}, P)
        return dict(s.take_rows())

    async def restore(self, nodes: dict[str, int]) -> dict[str, dict[bytes, bytes]]:
        """Recover ``nodes`` (node -> partition) as a restarted worker does: the node table's changelog read
        back by Faust's recovery, the feedback table's rows handed to the loop; the window rows, by node."""
        windows = {n: self.window_rows(n) for n in nodes}
        events = [SimpleNamespace(key=k, value=v, message=SimpleNamespace(value=v, partition=nodes[n]))
                  for n, rows in windows.items() for k, v in rows.items()]
        self.table.data.apply_changelog_batch(events, lambda k: k, lambda v: v)
        partitions = set(nodes.values())
        await self.table.on_recovery_completed({TP(self.changelog, p) for p in partitions}, set())
        trackers = {}
        for n, p in nodes.items():
            t = NodeTracker()
            t.add("oldapp", 10.0, 12.0)
            trackers[node_row_key(p, n)] = orjson.dumps(t.to_dict())
        self.loop.restore(trackers, partitions)
        return windows

    async def revoke(self, partition: int) -> None:
        """``partition`` moves to another worker (the tables' rebalance hooks)."""
        revoked = {TP(self.table.ownership_topic, partition)}
        await self.table.on_rebalance(set(), revoked, set())
        await self.loop.revoke({partition})

    def metrics(self, node: str) -> None:
        """A node-metrics snapshot of ``node``, now."""
        snap = {"node": node, "ts": self.clock.now(), "node_class": "gpu", "gpu_model": "Tesla M40",
                "metrics": {"nvidia_smi_utilization_gpu": 0.4}}
        self.nodes.intake.handlers["node-metrics"](decode("node-metrics", encode("node-metrics", snap)), P)

    def prediction(self, node: str) -> None:
        """A prediction naming ``node`` (the join hears of it; no window state is made)."""
        self.task += 1
        p = {"task_id": f"t{self.task}", "app": "gCTF", "node": node, "ts": self.clock.now(),
             "predicted_rtt_ms": 100.0, "model_version": None}
        handlers = self.loop.intake.handlers  # type: ignore[union-attr]
        handlers["rtt-predictions"](decode("rtt-predictions", encode("rtt-predictions", p)), P)

    def tombstones(self, node: str) -> dict[str, set[tuple[int, bytes]]]:
        """Every tombstone sent for ``node``: window rows (changelog), node-features, node-weights."""
        key = node.encode()
        return {
            "changelog": {(p, k) for t, p, k, v in self.sender.sent
                          if t == self.changelog and v is None and k is not None and node_of_key(k) == node},
            "node-features": {(p, k) for t, p, k, v in self.sender.sent
                              if t == self.settings.topic("node-features") and k == key and v is None},
            "node-weights": {(0, key) for n, v in self.weights if n == node and v is None},
        }

    def held_rows(self, node: str) -> set[bytes]:
        return {k for k in self.table.data.keys() if node_of_key(k) == node}

    def evicted(self) -> float:
        return self.ctx.metrics.value("rtt_worker_evicted_total", kind="node")


async def test_a_restored_node_never_heard_again_is_evicted_after_the_delay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = Worker(tmp_path, monkeypatch)
    loop = w.loop
    features_partition = partition_for(b"gone", contract("node-features").partitions)
    windows = await w.restore({"gone": P, "back": P, "moved": MOVED_P})
    assert {"gone", "back", "moved"} <= loop.trackers.keys()
    assert all(w.held_rows(n) == windows[n].keys() for n in windows)

    await w.tick()  # found held, unheard: the delay counts from now
    assert w.evicted() == 0.0

    w.clock.advance(AFTER_S / 2)
    w.metrics("back")  # named again: its window is rebuilt from the restored rows
    await w.revoke(MOVED_P)  # its new owner holds "moved" now
    await w.tick()
    assert w.evicted() == 0.0

    w.clock.advance(AFTER_S / 2)
    w.metrics("back")
    await w.tick()
    assert w.evicted() == 1.0  # "gone", AFTER_S after it was found unheard
    assert "gone" not in loop.trackers and "gone" not in loop.partitions and "gone" not in w.nodes.store.states
    assert w.held_rows("gone") == set()
    assert not [k for k in w.table.data._key_partition if node_of_key(k) == "gone"]  # Faust's record of them too
    sent = w.tombstones("gone")
    assert sent["changelog"] == {(P, k) for k in windows["gone"]}  # every window row, in its partition
    assert sent["node-features"] == {(features_partition, b"gone")}
    assert sent["node-weights"] == {(0, b"gone")}
    await loop.checkpoint()
    assert (node_row_key(P, "gone"), None) in w.rows  # its tracker's row deleted

    # heard again: kept, with its state; moved away: left to its new owner, whose rows are not deleted
    for _ in range(4):
        w.clock.advance(AFTER_S / 2)
        w.metrics("back")
        await w.tick()
    assert w.evicted() == 1.0
    assert "back" in loop.trackers and "back" in w.nodes.store.states and w.held_rows("back")
    for n in ("back", "moved"):
        assert w.tombstones(n) == {"changelog": set(), "node-features": set(), "node-weights": set()}
    assert "moved" not in loop.trackers and "moved" not in loop.partitions


async def test_a_restored_node_heard_only_through_the_join_takes_its_window_rows_when_evicted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = Worker(tmp_path, monkeypatch)
    loop = w.loop
    windows = await w.restore({"joined": P})
    await w.tick()

    w.clock.advance(AFTER_S / 2)
    w.prediction("joined")  # heard of through the join only: no window state in memory
    await w.tick()
    assert w.evicted() == 0.0 and "joined" not in w.nodes.store.states

    w.clock.advance(AFTER_S)
    await w.tick()
    assert w.evicted() == 1.0  # silent AFTER_S since its prediction: its restored rows go with it
    assert "joined" not in loop.trackers and "joined" not in loop.partitions and w.held_rows("joined") == set()
    sent = w.tombstones("joined")
    assert sent["changelog"] == {(P, k) for k in windows["joined"]}
    assert sent["node-features"] and sent["node-weights"]
    await loop.checkpoint()
    assert (node_row_key(P, "joined"), None) in w.rows
