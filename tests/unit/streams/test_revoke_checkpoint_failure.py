"""A rebalance whose checkpoint of the revoked partitions fails (the broker away, a batch not delivered) does not
end the worker: the failure is logged on one line and counted, and the revoked partitions' state leaves memory
all the same.

Faust calls the tables' ``on_rebalance`` from its assignment callback and crashes the app on whatever escapes it:
a worker that lost partitions while its sender's flush raised used to exit with a traceback. Dropping the state
is safe: a checkpoint writes its rows, then (once they are stored) the read positions, so the positions stored
for a revoked partition never run ahead of its stored rows, and its new owner restores the last stored checkpoint
and reads again from its positions. Nothing of a revoked partition's changelog is written by this worker
afterwards: what the intake's sender still held of it (the rows, or the read positions behind rows that got
through) is discarded; it used to be sent again by the intake's next ship, after the new owner's writes, so the
next restore of the partition applied its messages twice or lost their effects. The sender's records to other
topics (node-features, training samples, dead letters: keyed by node, task or app, partitioned otherwise) are
effects this worker applied and still go out. A node of a revoked partition is not evicted while the revoke's
checkpoint is being written (its tombstones would go to the lost partition).

The intake's sender here is the real :class:`~app.kafka.batches.BatchSender`, over a stand-in broker.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from aiokafka.errors import KafkaTimeoutError
from faust.types import TP
from intake_standins import Batch
from test_revoke_memory import OWNERSHIP, Intake, app_for, feedback_loop, revoked, row_partition

from app.clock import ManualClock
from app.config import Settings
from app.kafka.batches import BatchSender
from app.streams.changelog import MARKER_KEY
from app.streams.context import attach
from app.streams.feedback_table import FeedbackTable, feedback_table, offsets_row_key
from app.streams.node_state import node_of_key
from app.streams.node_table import NodeStateTable, NodeStore, node_state_table, positions_key
from app.streams.options import WorkerOptions

FAILURES = "rtt_worker_revoke_checkpoint_failures_total"
NODES = {"gpu-0": 0, "gpu-1": 1}
SAMPLES = "training-samples"  # another topic the intake's sender writes, partitioned otherwise


class Broker:
    """aiokafka's ``create_batch`` / ``send_batch`` over a log per partition: a batch ``down`` says so expires
    (``KafkaTimeoutError``, the broker away past the request timeout), any other is stored at once."""

    def __init__(self) -> None:
        self.log: dict[tuple[str, int], list[tuple[bytes | None, bytes | None]]] = defaultdict(list)
        self.tried: list[tuple[str, int, bytes | None]] = []  # every record handed over: topic, partition, key
        self.down: Callable[[str, int, list[bytes | None]], bool] = lambda topic, partition, keys: False

    def create_batch(self) -> Batch:
        return Batch()

    async def send_batch(self, batch: Batch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        keys = [k for k, _ in batch.records]
        self.tried += [(topic, partition, k) for k in keys]
        if self.down(topic, partition, keys):
            fut.set_exception(KafkaTimeoutError())
        else:
            fut.set_result(SimpleNamespace(offset=len(self.log[(topic, partition)])))
            self.log[(topic, partition)] += batch.records
        return fut

    def keys(self, topic: str, partition: int, since: int = 0) -> list[bytes | None]:
        """The keys stored in ``topic[partition]`` from its ``since``-th record on (the markers left out)."""
        return [k for k, _ in self.log[(topic, partition)][since:] if k != MARKER_KEY]


def real_sender(intake: Intake) -> Broker:
    """Give ``intake`` a real :class:`BatchSender` on a stand-in broker; the broker."""
    broker = Broker()
    intake.live_sender = BatchSender(broker)  # type: ignore[assignment,arg-type]
    return broker


def broker_away(nth: int, positions: bytes) -> Callable[[str, int, list[bytes | None]], bool]:
    """From the revoke's checkpoint on: every batch expires (``nth`` 1: the rows not stored), or (2) only those
    of the read positions ``positions`` and of other topics (the rows stored, the positions after them not)."""
    if nth == 1:
        return lambda topic, partition, keys: True
    return lambda topic, partition, keys: topic == SAMPLES or positions in keys


def warnings_of_streams(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The WARNING lines of the tables (the sender's own delivery failures left out)."""
    return [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("app.streams")]


def worker_app(tmp_path: Path) -> tuple[faust.App, Any]:
    app = app_for(tmp_path)
    return app, attach(app, Settings(), WorkerOptions())


def feedback_worker(tmp_path: Path, clock: ManualClock) -> tuple[Any, FeedbackTable, Any, Intake, Broker]:
    """A feedback table and loop holding partitions 0 and 1, its intake's sender real; one checkpoint stored."""
    app, ctx = worker_app(tmp_path)
    table = feedback_table(app, "feedback", OWNERSHIP, 4)
    loop = feedback_loop(table, clock)
    loop.intake = intake = Intake({0, 1})  # type: ignore[assignment]
    broker = real_sender(intake)
    loop.held = {0, 1}
    table.on_revoke, table.on_restore = loop.revoke, loop.restore
    for node, partition in NODES.items():
        loop.partitions[node] = partition
        loop.node_class[node] = "gpu"
        loop.tracker(node).add("gCTF", 100.0, 110.0)
        loop.dirty_nodes.add(node)
        loop.buffer.add_prediction(("task-1", node), {"predicted_rtt_ms": 100.0})
    return ctx, table, loop, intake, broker


@pytest.mark.parametrize("nth", [1, 2], ids=["rows-not-stored", "positions-not-stored"])
async def test_a_failed_revoke_checkpoint_drops_the_feedback_state_and_the_worker_goes_on(
        tmp_path: Path, nth: int, caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock(1000.0)
    ctx, table, loop, intake, broker = feedback_worker(tmp_path, clock)
    sender = intake.live_sender
    await loop.checkpoint()
    for node in NODES:  # changes after the last stored checkpoint, which the failed one does not store
        loop.tracker(node).add("gCTF", 100.0, 120.0)
        loop.dirty_nodes.add(node)
        loop.buffer.add_prediction(("task-2", node), {"predicted_rtt_ms": 100.0})
    topic = table.changelog_topic.get_topic_name()
    stored, tried = len(broker.log[(topic, 0)]), len(broker.tried)
    broker.down = broker_away(nth, offsets_row_key(0))

    with caplog.at_level(logging.INFO, logger="app.streams"):
        await table.on_rebalance(set(), revoked({0}), set())  # before: KafkaTimeoutError out of on_rebalance

    failed = warnings_of_streams(caplog)
    assert len(failed) == 1 and failed[0].exc_info is None and "[0]" in failed[0].getMessage()
    assert ctx.metrics.value(FAILURES, table="feedback") == 1.0
    assert sorted(loop.trackers) == sorted(loop.partitions) == sorted(loop.node_class) == ["gpu-1"]
    assert sorted(loop.buffer.keys()) == [("task-1", "gpu-1"), ("task-2", "gpu-1")]
    assert not [k for k in table.data if row_partition(k) == 0]
    assert 0 not in intake.positions and loop.held == {1}
    handed = [k for t, p, k in broker.tried[tried:] if (t, p) == (topic, 0)]
    if nth == 1:  # the rows were not stored: no read position of the revoked partition went out after them
        assert broker.keys(topic, 0, stored) == [] and offsets_row_key(0) not in handed
    else:  # the rows were stored, the positions (taken with them) were not
        assert broker.keys(topic, 0, stored) and offsets_row_key(0) in handed
        assert offsets_row_key(0) not in broker.keys(topic, 0, stored)

    # the broker is back: the intake's next ship and the next checkpoints write nothing of the revoked partition
    # (before: its rows, or its positions behind the rows, sent again), the other one as before
    broker.down = lambda topic, partition, keys: False
    after, after_1 = len(broker.log[(topic, 0)]), len(broker.log[(topic, 1)])
    await sender.ship()
    loop.tracker("gpu-1").add("gCTF", 100.0, 130.0)
    loop.dirty_nodes.add("gpu-1")
    await loop.checkpoint()
    assert broker.keys(topic, 0, after) == []
    assert offsets_row_key(1) in broker.keys(topic, 1, after_1)
    assert sender.discarded > 0  # what the sender held of changelog partition 0
    assert not [k for k in table.data if row_partition(k) == 0]


async def test_a_revoke_that_raises_outside_the_checkpoint_still_drops_the_rows(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Whatever the revoke hook raises, the table's rows of the lost partitions leave memory and nothing escapes."""
    app, ctx = worker_app(tmp_path)
    table = feedback_table(app, "feedback", OWNERSHIP, 4)
    table.data[b"0|n|gpu-0"] = b"{}"
    table.data[b"1|n|gpu-1"] = b"{}"

    async def revoke(lost: set[int]) -> None:
        raise KafkaTimeoutError()

    table.on_revoke = revoke
    with caplog.at_level(logging.WARNING, logger="app.streams"):
        await table.on_rebalance(set(), revoked({0}), set())
    assert list(table.data) == [b"1|n|gpu-1"]
    assert ctx.metrics.value(FAILURES, table="feedback") == 1.0
    assert len(caplog.records) == 1 and caplog.records[0].exc_info is None


def node_worker(tmp_path: Path) -> tuple[Any, NodeStore, NodeStateTable, Intake, Broker]:
    """A node table holding partitions 0 and 1, its intake's sender real."""
    app, ctx = worker_app(tmp_path)
    store = NodeStore(30.0, WorkerOptions(), 1.0)
    table = node_state_table(app, "node-window", store, OWNERSHIP, 4)
    table.intake = intake = Intake({0, 1})  # type: ignore[assignment]
    return ctx, store, table, intake, real_sender(intake)


def snapshots(store: NodeStore, table: NodeStateTable, t0: float, nodes: dict[str, int] = NODES) -> None:
    for node, partition in nodes.items():
        state = store.state(node, partition, table.data.get)
        for t in range(5):
            state.update({"node": node, "ts": t0 + t, "node_class": "gpu", "gpu_model": "Tesla M40",
                          "metrics": {"metric_0": float(t)}}, partition=partition)


@pytest.mark.parametrize("nth", [1, 2], ids=["rows-not-stored", "positions-not-stored"])
async def test_a_failed_revoke_checkpoint_drops_the_node_states_and_the_worker_goes_on(
        tmp_path: Path, nth: int, caplog: pytest.LogCaptureFixture) -> None:
    ctx, store, table, intake, broker = node_worker(tmp_path)
    sender = intake.live_sender
    snapshots(store, table, 1000.0)
    await table.checkpoint()
    snapshots(store, table, 1005.0)  # not stored by the failed checkpoint
    topic = table.changelog_topic.get_topic_name()
    stored, tried = len(broker.log[(topic, 0)]), len(broker.tried)
    broker.down = broker_away(nth, positions_key(0))

    with caplog.at_level(logging.INFO, logger="app.streams"):
        await table.on_rebalance(set(), revoked({0}), set())  # before: KafkaTimeoutError out of on_rebalance

    failed = warnings_of_streams(caplog)
    assert len(failed) == 1 and failed[0].exc_info is None and "[0]" in failed[0].getMessage()
    assert ctx.metrics.value(FAILURES, table="node-window") == 1.0
    assert sorted(store.states) == ["gpu-1"]
    assert not [k for k in table.data if NODES.get(node_of_key(k)) == 0 or k == positions_key(0)]
    assert 0 not in intake.positions
    handed = [k for t, p, k in broker.tried[tried:] if (t, p) == (topic, 0)]
    if nth == 1:
        assert broker.keys(topic, 0, stored) == [] and positions_key(0) not in handed
    else:
        assert broker.keys(topic, 0, stored) and positions_key(0) in handed
        assert positions_key(0) not in broker.keys(topic, 0, stored)

    broker.down = lambda topic, partition, keys: False
    after, after_1 = len(broker.log[(topic, 0)]), len(broker.log[(topic, 1)])
    await sender.ship()  # the intake's next batch: before, the revoked partition's rows or positions went again
    snapshots(store, table, 1010.0, {"gpu-1": 1})
    await table.checkpoint()
    assert broker.keys(topic, 0, after) == []
    assert positions_key(1) in broker.keys(topic, 1, after_1)
    assert sender.discarded > 0 and store.leaving == set()


@pytest.mark.parametrize("kind", ["node-window", "feedback"])
async def test_what_the_sender_holds_for_other_topics_still_goes_out(tmp_path: Path, kind: str) -> None:
    """A revoke discards the lost changelog partitions only: a training sample, node-features or a dead letter
    this worker made (partitioned by task, node or app, whatever partition number) is its effect, applied, and
    is delivered once the broker is back."""
    others = [(SAMPLES, 0, b"task-2"), ("node-features", 0, b"gpu-0"), ("dead-letters", 0, b"gpu-0")]
    if kind == "node-window":
        _, store, node_table, intake, broker = node_worker(tmp_path)
        snapshots(store, node_table, 1000.0)
        table: Any = node_table
    else:
        _, table, loop, intake, broker = feedback_worker(tmp_path, ManualClock(1000.0))
    sender = intake.live_sender
    for topic, partition, key in others:
        sender.add(topic, partition, key, b"value")
    broker.down = lambda topic, partition, keys: True
    await table.on_rebalance(set(), revoked({0}), set())
    assert sender.undelivered >= len(others)
    broker.down = lambda topic, partition, keys: False
    await sender.flush()
    changelog = table.changelog_topic.get_topic_name()
    assert broker.keys(changelog, 0) == []
    for topic, partition, key in others:
        assert broker.log[(topic, partition)] == [(key, b"value")]


async def test_a_node_of_a_partition_being_revoked_is_not_evicted_while_its_last_checkpoint_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The eviction tick runs while the revoke waits for the broker: a silent node of the lost partition keeps its
    state and rows until the revoke drops them, and none of its tombstones (window rows, on the lost partition;
    node-features) goes out. Before, it was evicted then: its tombstones went to a partition its new owner
    writes, deleting the rows the new owner restores, and node-features forgot a node the new owner holds."""
    from test_restored_node_eviction import AFTER_S, P, Sender, Worker

    class Gated(Sender):
        """The intakes' sender, whose flush waits for ``gate`` (the broker slow to answer)."""

        def __init__(self) -> None:
            super().__init__()
            self.gate, self.flushing = asyncio.Event(), asyncio.Event()

        async def flush(self) -> int:
            self.flushing.set()
            await self.gate.wait()
            return len(self.sent)

        def take_rewound(self, topic: str) -> set[int]:
            return set()

    w = Worker(tmp_path, monkeypatch)
    windows = await w.restore({"quiet": P, "gone": P + 1})  # "gone": held, never named again
    w.sender = sender = Gated()
    w.nodes.intake.sender = w.loop.intake.sender = sender
    await w.tick()  # "gone" found unheard: its delay counts from now
    w.metrics("quiet")  # heard: its window state rebuilt, in partition P
    w.clock.advance(AFTER_S)  # both silent for the eviction delay
    revoke = asyncio.ensure_future(w.table.on_rebalance(set(), {TP(w.table.ownership_topic, P)}, set()))
    await asyncio.wait_for(sender.flushing.wait(), 5.0)

    await w.tick()  # while the revoke's checkpoint waits for the broker
    assert w.evicted() == 1.0 and "quiet" in w.nodes.store.states
    assert w.tombstones("quiet") == {"changelog": set(), "node-features": set(), "node-weights": set()}
    assert w.tombstones("gone")["changelog"] == {(P + 1, k) for k in windows["gone"]}  # a partition still held

    sender.gate.set()
    await revoke
    assert "quiet" not in w.nodes.store.states and w.nodes.store.leaving == set()
    assert w.tombstones("quiet") == {"changelog": set(), "node-features": set(), "node-weights": set()}


async def test_a_node_of_a_lost_partition_is_not_evicted_while_the_feedback_revoke_waits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Faust runs the tables' revokes one after the other, the node table's first: once it has dropped the
    partition's window states, the feedback table's revoke can still wait long (its checkpoint's flush). A silent
    node of the lost partition is not evicted then either: before, its node-features and node-weights tombstones
    went out, for a node the new owner holds."""
    from test_restored_node_eviction import AFTER_S, P, Sender, Worker

    class Flushing(Sender):
        async def flush(self) -> int:
            return len(self.sent)

        def take_rewound(self, topic: str) -> set[int]:
            return set()

    w = Worker(tmp_path, monkeypatch)
    w.sender = Flushing()
    w.nodes.intake.sender = w.loop.intake.sender = w.sender
    await w.restore({"quiet": P})
    w.metrics("quiet")  # heard: a window state and a tracker, of partition P
    w.clock.advance(AFTER_S)  # silent for the eviction delay
    await w.table.on_rebalance(set(), {TP(w.table.ownership_topic, P)}, set())  # the node table's revoke: done
    assert "quiet" not in w.nodes.store.states and w.nodes.store.leaving == set()
    assert w.ctx.metrics.value(FAILURES, table="node-window") == 0.0

    gate, writing = asyncio.Event(), asyncio.Event()

    async def write(rows: Any, **_kw: Any) -> int:  # the feedback checkpoint's write, the broker slow to answer
        writing.set()
        await gate.wait()
        return len(list(rows))

    w.loop.table.write = write  # type: ignore[method-assign]
    w.loop.dirty_nodes.add("quiet")
    revoke = asyncio.ensure_future(w.loop.revoke({P}))
    await asyncio.wait_for(writing.wait(), 5.0)

    await w.tick()  # while the feedback revoke's checkpoint waits
    assert w.evicted() == 0.0
    assert w.tombstones("quiet") == {"changelog": set(), "node-features": set(), "node-weights": set()}

    gate.set()
    await revoke
    assert "quiet" not in w.loop.partitions
    await w.tick()  # and once the revoke is done: the node is its new owner's, forgotten here, not evicted
    assert w.evicted() == 0.0 and "quiet" not in w.ctx.bounds.nodes
    assert w.tombstones("quiet") == {"changelog": set(), "node-features": set(), "node-weights": set()}
