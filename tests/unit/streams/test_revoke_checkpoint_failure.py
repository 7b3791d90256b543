"""A rebalance whose checkpoint of the revoked partitions fails (the broker away, a batch not delivered) does not
end the worker: the failure is logged on one line and counted, and the revoked partitions' state leaves memory
all the same.

Faust calls the tables' ``on_rebalance`` from its assignment callback and crashes the app on whatever escapes it:
a worker that lost partitions while its sender's flush raised used to exit with a traceback. Dropping the state
is safe: a checkpoint writes its rows, then (once they are stored) the read positions, so the positions stored
for a revoked partition never run ahead of its stored rows, and its new owner restores the last stored checkpoint
and reads again from its positions. Nothing of a revoked partition is written by this worker afterwards.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import faust
import pytest
from aiokafka.errors import KafkaTimeoutError
from test_revoke_memory import OWNERSHIP, Intake, app_for, feedback_loop, revoked, row_partition

from app.clock import ManualClock
from app.config import Settings
from app.streams.context import attach
from app.streams.feedback_table import feedback_table, offsets_row_key
from app.streams.node_state import node_of_key
from app.streams.node_table import NodeStore, node_state_table, positions_key
from app.streams.options import WorkerOptions

FAILURES = "rtt_worker_revoke_checkpoint_failures_total"
NODES = {"gpu-0": 0, "gpu-1": 1}


class FailingFlush:
    """Makes the sender's flush raise from its ``nth`` call on (1: the rows; 2: the read positions after them)."""

    def __init__(self, intake: Intake, nth: int = 1) -> None:
        self.sender = intake.live_sender
        self.calls = 0
        self.nth = nth
        self.failing = True
        self.added_before = 0
        self._flush = self.sender.flush

    def arm(self) -> None:
        self.calls = 0
        self.added_before = len(self.sender.sent)

        async def flush() -> int:
            self.calls += 1
            if self.failing and self.calls >= self.nth:
                raise KafkaTimeoutError()
            return await self._flush()

        self.sender.flush = flush  # type: ignore[method-assign]

    def added_since(self) -> list[tuple[int, bytes, bytes | None]]:
        return self.sender.sent[self.added_before:]


def worker_app(tmp_path: Path) -> tuple[faust.App, Any]:
    app = app_for(tmp_path)
    return app, attach(app, Settings(), WorkerOptions())


@pytest.mark.parametrize("nth", [1, 2], ids=["rows-not-stored", "positions-not-stored"])
async def test_a_failed_revoke_checkpoint_drops_the_feedback_state_and_the_worker_goes_on(
        tmp_path: Path, nth: int, caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock(1000.0)
    app, ctx = worker_app(tmp_path)
    table = feedback_table(app, "feedback", OWNERSHIP, 4)
    loop = feedback_loop(table, clock)
    loop.intake = intake = Intake({0, 1})  # type: ignore[assignment]
    loop.held = {0, 1}
    table.on_revoke, table.on_restore = loop.revoke, loop.restore
    for node, partition in NODES.items():
        loop.partitions[node] = partition
        loop.node_class[node] = "gpu"
        loop.tracker(node).add("gCTF", 100.0, 110.0)
        loop.dirty_nodes.add(node)
        loop.buffer.add_prediction(("task-1", node), {"predicted_rtt_ms": 100.0})
    await loop.checkpoint()
    for node in NODES:  # changes after the last stored checkpoint, which the failed one does not store
        loop.tracker(node).add("gCTF", 100.0, 120.0)
        loop.dirty_nodes.add(node)
        loop.buffer.add_prediction(("task-2", node), {"predicted_rtt_ms": 100.0})
    failing = FailingFlush(intake, nth)  # type: ignore[arg-type]
    failing.arm()

    with caplog.at_level(logging.INFO, logger="app.streams"):
        await table.on_rebalance(set(), revoked({0}), set())  # before: KafkaTimeoutError out of on_rebalance

    failed = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(failed) == 1 and failed[0].exc_info is None and "[0]" in failed[0].getMessage()
    assert ctx.metrics.value(FAILURES, table="feedback") == 1.0
    assert sorted(loop.trackers) == sorted(loop.partitions) == sorted(loop.node_class) == ["gpu-1"]
    assert sorted(loop.buffer.keys()) == [("task-1", "gpu-1"), ("task-2", "gpu-1")]
    assert not [k for k in table.data if row_partition(k) == 0]
    assert 0 not in intake.positions and loop.held == {1}
    written = failing.added_since()
    if nth == 1:  # the rows were not stored: no read position of the revoked partition went out after them
        assert (0, offsets_row_key(0)) not in {(p, k) for p, k, _ in written}
    else:  # the rows were stored, the positions (taken with them) were not
        assert [k for p, k, _ in written if p == 0 and k == offsets_row_key(0)] == [offsets_row_key(0)]

    # the broker is back: the next checkpoints write nothing of the revoked partition, the other one as before
    failing.failing = False
    failing.arm()
    loop.tracker("gpu-1").add("gCTF", 100.0, 130.0)
    loop.dirty_nodes.add("gpu-1")
    await loop.checkpoint()
    assert {p for p, _, _ in failing.added_since()} == {1}
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


@pytest.mark.parametrize("nth", [1, 2], ids=["rows-not-stored", "positions-not-stored"])
async def test_a_failed_revoke_checkpoint_drops_the_node_states_and_the_worker_goes_on(
        tmp_path: Path, nth: int, caplog: pytest.LogCaptureFixture) -> None:
    app, ctx = worker_app(tmp_path)
    store = NodeStore(30.0, WorkerOptions(), 1.0)
    table = node_state_table(app, "node-window", store, OWNERSHIP, 4)
    table.intake = intake = Intake({0, 1})  # type: ignore[assignment]

    def snapshots(t0: float, nodes: dict[str, int] = NODES) -> None:
        for node, partition in nodes.items():
            state = store.state(node, partition, table.data.get)
            for t in range(5):
                state.update({"node": node, "ts": t0 + t, "node_class": "gpu", "gpu_model": "Tesla M40",
                              "metrics": {"metric_0": float(t)}}, partition=partition)

    snapshots(1000.0)
    await table.checkpoint()
    snapshots(1005.0)  # not stored by the failed checkpoint
    failing = FailingFlush(intake, nth)  # type: ignore[arg-type]
    failing.arm()

    with caplog.at_level(logging.INFO, logger="app.streams"):
        await table.on_rebalance(set(), revoked({0}), set())  # before: KafkaTimeoutError out of on_rebalance

    failed = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(failed) == 1 and failed[0].exc_info is None and "[0]" in failed[0].getMessage()
    assert ctx.metrics.value(FAILURES, table="node-window") == 1.0
    assert sorted(store.states) == ["gpu-1"]
    assert not [k for k in table.data if NODES.get(node_of_key(k)) == 0 or k == positions_key(0)]
    assert 0 not in intake.positions
    written = failing.added_since()
    if nth == 1:
        assert positions_key(0) not in {k for _, k, _ in written}
    else:
        assert [k for _, k, _ in written if k == positions_key(0)] == [positions_key(0)]

    failing.failing = False
    failing.arm()
    snapshots(1010.0, {"gpu-1": 1})
    await table.checkpoint()
    assert {p for p, _, _ in failing.added_since()} == {1}
