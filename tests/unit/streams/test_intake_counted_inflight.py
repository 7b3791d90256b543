"""A checkpoint in flight while reading goes on, and a revoke that comes meanwhile.

* The pending counts of a partition were bounded by merging the oldest two entries at the later offset: with a
  checkpoint's write in flight, an entry below the position it had taken moved past it, so the stored position
  no longer counted it; a revoke before the next stored checkpoint dropped it, and the new owner reads on from
  the stored position: counted by no worker. The newest two are merged now, never across a taken position.
* A revoke waited for the checkpoint in flight, then wrote its own: with the broker away, two request timeouts
  (some 80 s) where one was taken before, past the group's session and rebalance timeouts.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from intake_standins import Record
from test_intake_counted_settled import TP, S, Sender, completion, counted, intake, key, node_table
from test_revoke_memory import revoked

from app.clock import ManualClock
from app.drift.joinbuffer import JoinBuffer
from app.streams.changelog import Row
from app.streams.feedback_models import ModelCache
from app.streams.feedback_options import FeedbackOptions
from app.streams.feedback_state import FeedbackLoop
from app.streams.intake import UNCOUNTED_MAX, CheckpointFailed, CheckpointTurns
from app.streams.node_table import NodeStore
from app.streams.options import WorkerOptions


async def read(it: Any, first: int, last: int) -> None:
    for o in range(first, last):  # one message a batch
        await it.process({TP: [Record(o, completion(f"t{o}"))]})


async def test_a_position_stored_while_reading_goes_on_counts_what_it_covers() -> None:
    it = intake()
    await it.process({TP: [Record(o, completion(f"t{o}")) for o in range(10)]})  # type: ignore[dict-item]
    snapshot = it.position_rows(key)  # a checkpoint takes position 10, its write in flight
    assert orjson.loads(snapshot[0][2]) == {"task-completions": 10}
    await read(it, 10, 75)  # 65 more batches meanwhile: past UNCOUNTED_MAX entries
    assert len(it._uncounted[TP]) <= UNCOUNTED_MAX
    assert it.positions_stored(snapshot) == 10  # before: 0 (the first 10 merged past position 10)
    it.release({0})
    it.forget({0})  # revoked, its revoke checkpoint failed: the new owner reads on from 10
    assert counted(it) == 10


async def test_the_newest_merge_stays_bounded_and_counts_each_message_once() -> None:
    it = intake()
    await read(it, 0, 10)
    first = it.position_rows(key)  # taken at 10
    await read(it, 10, 20)
    second = it.position_rows(key)  # taken at 20, both in flight
    await read(it, 20, 5_000)
    assert len(it._uncounted[TP]) <= UNCOUNTED_MAX
    assert it.positions_stored(second) == 20  # both positions kept their boundary
    assert it.positions_stored(first) == 0
    assert it.positions_stored(it.position_rows(key)) == 4_980 and counted(it) == 5_000
    assert not it._uncounted and not it._taken  # every checkpoint settled: nothing pinned
    await read(it, 5_000, 5_200)  # no checkpoint in flight: merged, a later position counts them all
    assert len(it._uncounted[TP]) <= UNCOUNTED_MAX
    early = it.positions_stored([(0, key(0), orjson.dumps({"task-completions": 5_100}))])
    assert early <= 100  # delayed by the merge at most, never more than the position covers
    assert it.positions_stored(it.position_rows(key)) == 200 - early and counted(it) == 5_200


async def test_a_failed_checkpoint_releases_its_positions() -> None:
    it = intake()
    await read(it, 0, 10)
    rows = it.position_rows(key)
    it.positions_held(rows, {})  # its write failed before anything was stored
    assert counted(it) == 0 and not it._taken


class SlowSender(Sender):
    """Every flush takes ``delay_s`` (the broker away until the request times out), then fails."""

    delay_s = 1.0

    async def flush(self) -> int:
        self.pending = []
        await asyncio.sleep(self.delay_s)
        raise TimeoutError("request timed out")


async def test_a_revoke_waits_at_most_one_request_timeout(tmp_path: Path) -> None:
    table, it = node_table(tmp_path, SlowSender())
    await it.process({TP: [Record(o, completion(f"t{o}")) for o in range(5)]})  # type: ignore[dict-item]
    periodic = asyncio.ensure_future(table.checkpoint())
    await asyncio.sleep(0.5)  # half-way through its request
    t0 = time.monotonic()
    await table.on_rebalance(set(), revoked({0}), set())
    took = time.monotonic() - t0
    with pytest.raises(TimeoutError):
        await periodic
    assert took < SlowSender.delay_s * 1.2, f"the revoke took {took:.2f} s for a {SlowSender.delay_s} s request"
    assert counted(it) == 0 and 0 not in {tp.partition for tp in it.positions}  # the new owner counts them


class HungSender(Sender):
    """A flush that hangs far past the request timeout (a producer queue that never drains)."""

    async def flush(self) -> int:
        self.pending = []
        await asyncio.sleep(30)
        return 0


async def test_a_revoke_gives_up_after_one_request_timeout(tmp_path: Path, caplog: Any) -> None:
    table, it = node_table(tmp_path, HungSender())
    it.request_timeout_ms = 300
    await it.process({TP: [Record(o, completion(f"t{o}")) for o in range(5)]})  # type: ignore[dict-item]
    periodic = asyncio.ensure_future(table.checkpoint())
    await asyncio.sleep(0.05)
    t0 = time.monotonic()
    await table.on_rebalance(set(), revoked({0}), set())
    assert time.monotonic() - t0 < 0.6
    assert "not done within 0.3 s" in caplog.text  # the revoke-failed line
    assert table.revoke_failures._value.get() == 1
    periodic.cancel()
    with pytest.raises(asyncio.CancelledError):
        await periodic
    assert counted(it) == 0 and not it._uncounted.get(TP)  # forgotten: the new owner reads and counts them


async def test_a_revoke_after_a_checkpoint_stored_writes_its_own(tmp_path: Path) -> None:
    table, it = node_table(tmp_path, Sender())
    await it.process({TP: [Record(o, completion(f"t{o}")) for o in range(5)]})  # type: ignore[dict-item]
    periodic = asyncio.ensure_future(table.checkpoint())
    await asyncio.sleep(0)
    await it.process({TP: [Record(5, completion("t5"))]})  # type: ignore[dict-item]
    await table.on_rebalance(set(), revoked({0}), set())  # waits for the periodic one, then stores position 6
    assert await periodic >= 1
    assert counted(it) == 6


class SlowFeedbackTable:
    """The feedback table whose every write takes ``delay_s``, then fails (the broker away)."""

    delay_s = 1.0

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    async def write(self, rows: list[Any], *, last: list[Row] = (),  # type: ignore[assignment]
                    sender: object = None, held: object = None) -> int:
        await asyncio.sleep(self.delay_s)
        raise TimeoutError("request timed out")


async def test_a_feedback_revoke_waits_at_most_one_request_timeout() -> None:
    it = intake()
    clock = ManualClock(3.0)
    loop = FeedbackLoop(S, FeedbackOptions(), clock, SimpleNamespace(store=NodeStore(10.0, WorkerOptions(), 1.0)),
                        ModelCache(S), JoinBuffer(60.0, clock=clock), SlowFeedbackTable())  # type: ignore[arg-type]
    loop.intake = it
    await it.process({TP: [Record(o, completion(f"t{o}")) for o in range(5)]})  # type: ignore[dict-item]
    periodic = asyncio.ensure_future(loop.checkpoint())
    await asyncio.sleep(0.5)
    t0 = time.monotonic()
    with pytest.raises(CheckpointFailed):
        await loop.revoke({0})  # the table logs and counts it (revoke_failed)
    took = time.monotonic() - t0
    with pytest.raises(TimeoutError):
        await periodic
    assert took < SlowFeedbackTable.delay_s * 1.2, f"the revoke took {took:.2f} s"
    assert counted(it) == 0 and not it._uncounted.get(TP)


async def test_turns_revoke_bounds_the_wait_for_the_lock() -> None:
    turns = CheckpointTurns()
    release = asyncio.Event()

    async def stuck() -> int:
        await release.wait()
        return 1

    async def write() -> int:
        return 2

    in_flight = asyncio.ensure_future(turns.take(stuck))
    await asyncio.sleep(0)
    with pytest.raises(TimeoutError, match="not done within 0.05 s"):
        await turns.revoke(write, 0.05)
    release.set()
    assert await in_flight == 1
    assert await turns.revoke(write, 0.05) == 2  # nothing in flight: written
