"""JoinBuffer's held values: listed oldest key first whatever the keys' names, and a release reaches the changelog."""

from __future__ import annotations

from app.clock import ManualClock
from app.drift.joinbuffer import JoinBuffer


def test_held_values_come_oldest_first_not_in_key_order() -> None:
    clock = ManualClock(1000.0)
    jb = JoinBuffer(ttl_s=60.0, clock=clock)
    for task in ("t3", "t1", "t2"):  # arrival order differs from the keys' sort order
        jb.add_completion((task, "n1"), {"rtt_ms": 100.0})
        clock.advance(1.0)
    for task in ("t1", "t2", "t3"):
        jb.hold((task, "n1"), {"sample_of": task})
    assert [key for key, _ in jb.held()] == [("t3", "n1"), ("t1", "n1"), ("t2", "n1")]
    assert [value["sample_of"] for _, value in jb.held()] == ["t3", "t1", "t2"]


def test_a_released_value_is_a_change_so_a_restart_does_not_bring_it_back() -> None:
    jb = JoinBuffer(ttl_s=60.0, clock=ManualClock(1000.0))
    key = ("t1", "n1")
    jb.add_completion(key, {"rtt_ms": 100.0})
    jb.hold(key, {"sample": 1})
    upserts, _ = jb.take_changes()
    assert upserts[key]["h"] == {"sample": 1}
    jb.release(key)
    upserts, removed = jb.take_changes()
    assert key in upserts and "h" not in upserts[key] and not removed
    restored = JoinBuffer(ttl_s=60.0, clock=ManualClock(1000.0))
    restored.load(upserts)
    assert restored.held() == [] and restored.held_value(key) is None
