"""A checkpoint in flight that outlives a revoke's wait (one request timeout) leaves the revoked partitions be.

The revoke gave up waiting and forgot the partitions (their new owner writes them from then on), but the checkpoint
went on: in the node table, a slow first flush over, it wrote the lost partition's read position and marker after
the revoke, and put the position row back in the table's data; in the feedback loop, failing late, it took back
the lost partition's changes (the next checkpoint wrote a tombstone into a changelog partition no longer owned, and
its join entries came back of no known partition), and succeeding late, it wrote the lost partition's position.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from intake_standins import Record
from test_intake_counted_settled import TP, S, Sender, batch, completion, counted, intake, node_table
from test_revoke_memory import revoked

from app.clock import ManualClock
from app.drift.joinbuffer import JoinBuffer
from app.streams.changelog import Row
from app.streams.feedback_models import ModelCache
from app.streams.feedback_options import FeedbackOptions
from app.streams.feedback_state import FeedbackLoop
from app.streams.feedback_table import join_row_key, offsets_row_key, row_partition
from app.streams.intake import CheckpointTurns
from app.streams.node_table import NodeStore, positions_key
from app.streams.options import WorkerOptions


class SlowThenOk(Sender):
    """The first flush takes 0.4 s (a slow broker), then succeeds; records every key added, and whether after the
    revoke returned."""

    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0
        self.added: list[tuple[bool, bytes | None]] = []
        self.revoked = False

    def add(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
        self.added.append((self.revoked, key))
        super().add(topic, partition, key, value)

    async def flush(self) -> int:
        self.flushes += 1
        if self.flushes == 1:
            await asyncio.sleep(0.4)
        return await super().flush()


async def test_no_write_of_a_lost_partition_after_a_timed_out_revoke(tmp_path: Path) -> None:
    sender = SlowThenOk()
    table, it = node_table(tmp_path, sender)
    it.request_timeout_ms = 100
    await it.process(batch(0, 4))  # type: ignore[arg-type]
    periodic = asyncio.ensure_future(table.checkpoint())
    await asyncio.sleep(0.01)
    await table.on_rebalance(set(), revoked({0}), set())  # times out after 0.1 s: revoke-failed path
    sender.revoked = True
    await periodic
    late = [k for after, k in sender.added if after]
    assert late == [], f"written after the revoke returned: {late}"  # before: the position and the marker
    assert positions_key(0) not in table.data, "a lost partition's row back in memory"
    assert counted(it) == 0  # the new owner reads them again from the positions last stored, and counts them


class LateTable:
    """The feedback table: the first write hangs past the revoke's wait, then fails (``fails``) or stores its rows;
    later writes are recorded."""

    def __init__(self, fails: bool) -> None:
        self.data: dict[bytes, bytes] = {}
        self.fails = fails
        self.calls = 0
        self.written: list[Any] = []

    async def write(self, rows: list[Any], *, last: list[Row] = (), sender: object = None,  # type: ignore[assignment]
                    held: Any = None) -> int:
        self.calls += 1
        mine = [(row_partition(k), k, v) for k, v in rows] + list(last)
        if self.calls == 1:
            await asyncio.sleep(0.4)
            if self.fails:
                raise TimeoutError("request timed out")
        self.written += [r for r in mine if held is None or held(r[0])]  # as write_rows leaves them out
        return len(rows)


def feedback(table: LateTable) -> tuple[FeedbackLoop, Any]:
    it = intake()
    it.request_timeout_ms = 100  # the revoke waits 0.1 s at most
    clock = ManualClock(3.0)
    loop = FeedbackLoop(S, FeedbackOptions(), clock, SimpleNamespace(store=NodeStore(10.0, WorkerOptions(), 1.0)),
                        ModelCache(S), JoinBuffer(60.0, clock=clock), table)  # type: ignore[arg-type]
    loop.intake = it
    loop.held = {0, 1}
    return loop, it


async def revoke_during_a_checkpoint(loop: FeedbackLoop) -> None:
    periodic = asyncio.ensure_future(loop.checkpoint())
    await asyncio.sleep(0.01)
    try:
        await loop.revoke({0})
    except Exception:  # noqa: BLE001 - the table logs and counts it (revoke_failed)
        pass
    try:
        await periodic
    except Exception:  # noqa: BLE001
        pass


async def test_a_late_failure_of_the_checkpoint_in_flight_takes_no_lost_row_back() -> None:
    loop, it = feedback(LateTable(fails=True))
    await it.process({TP: [Record(o, completion(f"t{o}")) for o in range(5)]})  # type: ignore[dict-item]
    loop._deleted_rows = [(join_row_key(0, "n1", "t1"), None), (join_row_key(1, "n2", "t2"), None)]
    await revoke_during_a_checkpoint(loop)
    assert [k for k, _ in loop._deleted_rows] == [join_row_key(1, "n2", "t2")]  # before: partition 0's too
    loop.table.written.clear()  # type: ignore[attr-defined]  # what the revoke itself wrote is its own
    await loop.checkpoint()
    assert [k for p, k, _ in loop.table.written if p == 0] == []  # type: ignore[attr-defined]  # before: the tombstone
    assert counted(it) == 0


async def test_a_late_success_of_the_checkpoint_in_flight_writes_no_lost_position() -> None:
    loop, it = feedback(LateTable(fails=False))
    await it.process({TP: [Record(o, completion(f"t{o}")) for o in range(5)]})  # type: ignore[dict-item]
    await revoke_during_a_checkpoint(loop)
    keys = [k for _, k, _ in loop.table.written]  # type: ignore[attr-defined]
    assert offsets_row_key(0) not in keys  # before: written after the revoke returned
    assert counted(it) == 0  # the new owner counts them


def test_a_revoke_fences_only_the_checkpoints_started_before_it() -> None:
    turns = CheckpointTurns()
    before = turns.holder()
    turns.fence({0})
    after = turns.holder()
    assert (before(0), before(1), after(0), after(1)) == (False, True, True, True)
