"""The broker loses its data under a worker that restored its tables from the changelogs when it started.

Faust's recovery keeps, for each changelog partition a worker holds, the offset it read that partition up to.
A worker that restored rows has such offsets; when the memory-only broker came back empty, the recreated
changelogs ended below them and the next recovery raised ConsistencyError: the worker exited (a Faust
traceback, exit 1) about 10 s after the broker was back. A worker that had restored nothing read them from
-1 and survived (test_fault_broker_wipe.py). Here the worker is restarted (SIGKILL) while the broker holds its
changelogs, so that it restores them; then the broker wipe scenario runs as for a fresh worker: no process
dies, nothing produced after the wipe is lost or counted twice, the recreated changelogs hold every node's
window and tracker again, and each recreated partition is counted once (rtt_worker_changelog_rewinds_total),
whether the worker's writes or its recovery found it first.
"""

from __future__ import annotations

import ast
import asyncio
import re
from pathlib import Path

import pytest
from fault_outages import broker_wipe
from fault_stack import Load, Stack, drained, wait_for

from app.contracts import contract
from app.sim.scripted import start_worker

pytestmark = pytest.mark.integration

RESTORED = re.compile(r"partitions \[[0-9, ]+\]: restored (\d+) join entries, (\d+) node trackers")


async def restart_restoring(stack: Stack, load: Load) -> Path:
    """Write the changelogs under load, SIGKILL the worker and start another that restores them; its log.

    25 s of checkpoints (one a second) leave each changelog partition several times longer than the state
    it holds, which is all the worker writes again after the wipe before its next recovery: that recovery
    finds the recreated partitions ending below the offsets this worker restored them up to."""
    assert stack.group is not None
    await load.run(25)
    await drained(stack, load.snapshots)
    await asyncio.sleep(3.0)  # a checkpoint (RTT_WORKER_CHECKPOINT_INTERVAL_S) stores what was read
    stack.group.children.pop("worker").kill()
    log_dir = stack.group.log_dir
    (log_dir / "worker.log").rename(log_dir / "worker-first.log")
    stack.worker_url = start_worker(stack.group, stack.settings, "worker")
    load.snapshots = 0  # what the new worker reads (its rtt_worker_messages_in_total) starts with it
    log_path = log_dir / "worker.log"

    def trackers_restored() -> bool:
        text = log_path.read_text(errors="replace")
        return sum(int(m.group(2)) for m in RESTORED.finditer(text)) > 0

    await wait_for(trackers_restored, 60, "the restarted worker restoring node trackers from the changelog")
    return log_path


def test_broker_wiped_under_a_worker_that_restored_its_changelogs(tmp_path: Path) -> None:
    stack = Stack(tmp_path)
    try:
        stack.start()
        load = Load(stack.settings)
        log_path = asyncio.run(restart_restoring(stack, load))
        restored = stack.group.children["worker"] if stack.group is not None else None
        failed: BaseException | None = None
        try:
            outcome = asyncio.run(broker_wipe(stack, load))
        except Exception as exc:  # a worker that died fails its scrapes: its log says why first
            failed = exc
    finally:
        stack.stop()
    text = log_path.read_text(errors="replace")
    crash = re.search(r"ERROR faust.tables.recovery: .*Crashed.*", text)
    assert crash is None and "We experienced a crash" not in text, crash.group(0) if crash else text[-3000:]
    assert restored is not None and restored.returncode != 1, text[-3000:]
    if failed is not None:
        raise failed
    # found by the first checkpoint after the wipe or by the recovery that follows it, whichever comes first
    recreated = (r"changelog \S+-node-window-changelog partitions \[[0-9, ]+\] restart below what this (worker read of"
                 r" them|process wrote there)")
    assert re.search(recreated, text), text[-3000:]
    assert outcome.dead == 0, stack.dead()
    assert (outcome.lost, outcome.twice) == (0, 0), outcome
    found = re.search(r"changelog partitions found recreated (\{[^}]*\})", outcome.detail)
    assert found, outcome.detail
    rewinds = ast.literal_eval(found.group(1))
    assert set(rewinds) == {"node-window", "feedback"} and min(rewinds.values()) >= 1, rewinds
    partitions = contract("node-metrics").partitions  # each table's changelog: one wipe counts each at most once
    assert max(rewinds.values()) <= partitions, rewinds
