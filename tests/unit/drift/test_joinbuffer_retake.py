"""JoinBuffer.retake: the changes a failed changelog write took are tracked again, unless overtaken since."""

from __future__ import annotations

from app.clock import ManualClock
from app.drift.joinbuffer import JoinBuffer


def test_changes_of_a_failed_write_are_taken_again() -> None:
    clock = ManualClock(1000.0)
    jb = JoinBuffer(ttl_s=60.0, clock=clock)
    jb.add_completion(("t1", "n1"), {"rtt_ms": 110.0})
    jb.add_prediction(("t2", "n1"), {"predicted_rtt_ms": 50.0})
    jb.add_prediction(("t3", "n1"), {"predicted_rtt_ms": 70.0})
    clock.advance(61.0)
    jb.add_prediction(("t4", "n2"), {"predicted_rtt_ms": 90.0})
    assert len(jb.expire()) == 3
    upserts, removed = jb.take_changes()  # the write of these fails
    assert set(upserts) == {("t4", "n2")} and removed == {("t1", "n1"), ("t2", "n1"), ("t3", "n1")}
    assert jb.take_changes() == ({}, set())
    jb.retake(upserts, removed)
    again_upserts, again_removed = jb.take_changes()
    assert again_upserts == upserts and again_removed == removed


def test_changes_overtaken_since_are_not_taken_again() -> None:
    """A key written, then gone, is not written again; a key deleted, then back, is not deleted."""
    clock = ManualClock(1000.0)
    jb = JoinBuffer(ttl_s=60.0, clock=clock)
    jb.add_prediction(("gone", "n1"), {"predicted_rtt_ms": 50.0})
    jb.add_prediction(("stays", "n1"), {"predicted_rtt_ms": 60.0})
    clock.advance(30.0)
    jb.add_prediction(("back", "n1"), {"predicted_rtt_ms": 70.0})
    jb.add_prediction(("deleted", "n1"), {"predicted_rtt_ms": 80.0})
    assert jb.drop(lambda key: key[0] not in ("back", "deleted")) == 2
    upserts, _ = jb.take_changes()
    assert set(upserts) == {("gone", "n1"), ("stays", "n1")}
    removed = {("back", "n1"), ("deleted", "n1")}  # as if these deletions were taken by the failed write
    clock.advance(31.0)
    assert [e.key for e in jb.expire()] == [("gone", "n1"), ("stays", "n1")]
    jb.add_prediction(("stays", "n1"), {"predicted_rtt_ms": 61.0})  # a new arrival of the same key
    jb.add_prediction(("back", "n1"), {"predicted_rtt_ms": 71.0})
    jb.take_changes()
    jb.retake(upserts, removed)
    again_upserts, again_removed = jb.take_changes()
    assert set(again_upserts) == {("stays", "n1")} and again_upserts[("stays", "n1")]["p"] == {"predicted_rtt_ms": 61.0}
    assert again_removed == {("deleted", "n1")}
