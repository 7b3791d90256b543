"""The join entries of an evicted node are written to, and deleted from, the changelog partition their rows live in.

An evicted node leaves ``FeedbackLoop.partitions`` at once, while its join entries stay until they expire: always
when RTT_NODE_EVICT_AFTER_S < RTT_JOIN_TTL_S, else for an entry younger than the node's last message by up to a
second. Their deletions used to name partition 0: the write skipped them (no such row there), the real rows stayed
in memory and in the changelog, and a restart brought the node back with them.
"""

from __future__ import annotations

from pathlib import Path

import orjson
from test_revoke_checkpoint_failure import real_sender
from test_revoke_memory import OWNERSHIP, Intake, app_for, feedback_loop, revoked

from app.clock import ManualClock
from app.drift.tracker import NodeTracker
from app.streams.feedback_state import FeedbackLoop
from app.streams.feedback_table import FeedbackTable, feedback_table, join_row_key, node_row_key

P = 3
TTL_S = 600.0  # feedback_loop's JoinBuffer


def setup(tmp_path: Path) -> tuple[ManualClock, FeedbackTable, FeedbackLoop, Intake]:
    clock = ManualClock(1000.0)
    table = feedback_table(app_for(tmp_path), "feedback", OWNERSHIP, 8)
    loop = feedback_loop(table, clock)
    loop.intake = intake = Intake({P})  # type: ignore[assignment]
    loop.held = {P}
    table.on_revoke, table.on_restore = loop.revoke, loop.restore
    return clock, table, loop, intake


def join_rows(table: FeedbackTable) -> set[bytes]:
    return {k for k in table.data if b"|j|" in k}


def join_writes(intake: Intake) -> list[tuple[int, bytes, bytes | None]]:
    return [(p, k, v) for p, k, v in intake.live_sender.sent if b"|j|" in k]


async def test_an_evicted_nodes_join_row_is_deleted_from_its_partition_when_it_expires(tmp_path: Path) -> None:
    clock, table, loop, intake = setup(tmp_path)
    loop.partitions["gpu-3"] = P
    loop.buffer.add_prediction(("task-1", "gpu-3"), {"predicted_rtt_ms": 100.0})
    await loop.checkpoint()
    key = join_row_key(P, "gpu-3", "task-1")
    assert join_rows(table) == {key}

    loop.forget_nodes({"gpu-3"})  # evicted before its entry's TTL ran out
    clock.advance(TTL_S + 1.0)
    await loop.checkpoint()  # the entry expires: its row is deleted where it lives

    assert len(loop.buffer) == 0
    assert join_rows(table) == set()
    assert join_writes(intake)[-1] == (P, key, None)
    assert not [w for w in join_writes(intake) if w[0] != P]


async def test_an_entry_changed_before_the_eviction_is_written_to_its_nodes_partition(tmp_path: Path) -> None:
    """Checkpoints failing (the broker away) past the eviction: the entry's change is written after it."""
    clock, table, loop, intake = setup(tmp_path)
    loop.partitions["gpu-3"] = P
    loop.buffer.add_prediction(("task-1", "gpu-3"), {"predicted_rtt_ms": 100.0})
    loop.forget_nodes({"gpu-3"})
    await loop.checkpoint()
    key = join_row_key(P, "gpu-3", "task-1")
    assert join_rows(table) == {key}
    assert [(p, k) for p, k, _ in join_writes(intake)] == [(P, key)]

    clock.advance(TTL_S + 1.0)
    await loop.checkpoint()
    assert join_rows(table) == set()


async def test_a_node_heard_again_after_its_eviction_keeps_its_partition(tmp_path: Path) -> None:
    clock, table, loop, intake = setup(tmp_path)
    loop.partitions["gpu-3"] = P
    loop.buffer.add_prediction(("task-1", "gpu-3"), {"predicted_rtt_ms": 100.0})
    await loop.checkpoint()
    loop.forget_nodes({"gpu-3"})
    clock.advance(TTL_S / 2)
    loop.partitions["gpu-3"] = P  # a message names it again (the join sets its partition)
    loop.buffer.add_prediction(("task-2", "gpu-3"), {"predicted_rtt_ms": 100.0})
    clock.advance(TTL_S / 2 + 1.0)
    await loop.checkpoint()  # task-1 expires, task-2 stays
    assert join_rows(table) == {join_row_key(P, "gpu-3", "task-2")}
    clock.advance(TTL_S)
    await loop.checkpoint()
    assert join_rows(table) == set()
    assert not [w for w in join_writes(intake) if w[0] != P]


async def test_what_is_kept_of_evicted_nodes_goes_once_their_entries_have_expired(tmp_path: Path) -> None:
    clock, table, loop, intake = setup(tmp_path)
    for i in range(50):
        node = f"gpu-{i}"
        loop.partitions[node] = P
        loop.buffer.add_prediction(("task-1", node), {"predicted_rtt_ms": 100.0})
    await loop.checkpoint()
    loop.forget_nodes({f"gpu-{i}" for i in range(50)})
    clock.advance(TTL_S + 1.0)
    await loop.checkpoint()
    assert join_rows(table) == set()
    assert loop.partitions == {} and loop.evicted == {}


async def test_a_revoke_drops_the_join_entries_of_evicted_nodes_of_the_lost_partition(tmp_path: Path) -> None:
    """Their new owner restores them; this worker neither keeps nor expires them."""
    clock, table, loop, intake = setup(tmp_path)
    loop.partitions["gpu-3"] = P
    loop.buffer.add_prediction(("task-1", "gpu-3"), {"predicted_rtt_ms": 100.0})
    await loop.checkpoint()
    loop.forget_nodes({"gpu-3"})
    await table.on_rebalance(set(), revoked({P}), set())
    assert len(loop.buffer) == 0 and loop.evicted == {}
    assert join_rows(table) == set()
    sent = len(intake.live_sender.sent)
    clock.advance(TTL_S + 1.0)
    await loop.checkpoint()
    assert intake.live_sender.sent[sent:] == []


async def test_a_rewrite_writes_the_entries_of_evicted_nodes_to_their_partition(tmp_path: Path) -> None:
    clock, table, loop, intake = setup(tmp_path)
    loop.partitions["gpu-3"] = P
    loop.buffer.add_prediction(("task-1", "gpu-3"), {"predicted_rtt_ms": 100.0})
    await loop.checkpoint()
    loop.forget_nodes({"gpu-3"})
    sent = len(intake.live_sender.sent)
    loop.rewrite({P})  # the changelog was recreated empty under the worker
    await loop.checkpoint()
    assert (P, join_row_key(P, "gpu-3", "task-1")) in {(p, k) for p, k, _ in intake.live_sender.sent[sent:]}


async def test_a_deletion_queued_for_a_revoked_partition_is_not_written_when_the_partition_comes_back(
        tmp_path: Path) -> None:
    """An evicted node's tracker row is deleted by the next checkpoint; the revoke's checkpoint fails (the broker
    away), so the deletion stays queued. The partition goes to another worker, which hears of the node again and
    stores its tracker, then comes back here: the restored tracker is the node's, and the stale deletion must not
    be written over it (the changelog would lose the node's tracker while this worker holds it in memory, and the
    next restore would miss it)."""
    clock, table, loop, intake = setup(tmp_path)
    broker = real_sender(intake)
    loop.partitions["gpu-3"] = P
    loop.tracker("gpu-3").add("gCTF", 100.0, 110.0)
    loop.dirty_nodes.add("gpu-3")
    await loop.checkpoint()
    key = node_row_key(P, "gpu-3")
    assert key in table.data

    loop.forget_nodes({"gpu-3"})  # evicted: its tracker row's deletion queued for the next checkpoint
    broker.down = lambda topic, partition, keys: True
    await table.on_rebalance(set(), revoked({P}), set())  # its checkpoint not stored: the deletion with it
    broker.down = lambda topic, partition, keys: False

    newer = NodeTracker()  # the other owner's: the node named again there
    newer.add("gCTF", 100.0, 130.0)
    rows = {key: orjson.dumps(newer.to_dict())}
    table.data.update(rows)  # Faust's recovery of the partition, back here
    loop.restore(rows, {P})
    assert "gpu-3" in loop.trackers
    changelog = table.changelog_topic.get_topic_name()
    since = len(broker.log[(changelog, P)])
    await intake.live_sender.ship()  # the intake's next batch
    await loop.checkpoint()
    assert (key, None) not in broker.log[(changelog, P)][since:]
    assert table.data.get(key) == rows[key]
