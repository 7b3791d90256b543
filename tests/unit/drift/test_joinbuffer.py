"""The join buffer: either side first, TTL expiry, duplicates counted once, bounded, restorable."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.clock import ManualClock
from app.drift.joinbuffer import DUPLICATE, EXPIRED, HELD, MATCHED, NO_PREDICTION, WAITING, JoinBuffer


def test_prediction_first_then_completion_matches_once() -> None:
    jb = JoinBuffer(ttl_s=10.0, clock=ManualClock(0.0))
    assert jb.add_prediction(("t", "n"), {"p": 1}).outcome == WAITING
    r = jb.add_completion(("t", "n"), {"c": 2})
    assert (r.outcome, r.completion, r.prediction) == (MATCHED, {"c": 2}, {"p": 1})
    assert jb.add_prediction(("t", "n"), {"p": 1}).outcome == DUPLICATE
    assert jb.add_completion(("t", "n"), {"c": 2}).outcome == DUPLICATE


def test_same_task_on_other_node_is_another_key() -> None:
    jb = JoinBuffer(ttl_s=10.0, clock=ManualClock(0.0))
    jb.add_prediction(("t", "a"), 1)
    jb.add_prediction(("t", "b"), 2)
    assert jb.add_completion(("t", "b"), 3).prediction == 2
    assert ("t", "a") in jb


def test_expiry_outcomes_and_done_keys_leave_silently() -> None:
    clock = ManualClock(0.0)
    jb = JoinBuffer(ttl_s=10.0, clock=clock)
    jb.add_completion(("c", "n"), "completion")
    clock.advance(5.0)
    jb.add_prediction(("p", "n"), "prediction")
    jb.add_prediction(("m", "n"), 1)
    jb.add_completion(("m", "n"), 2)
    assert jb.expire() == []
    clock.advance(5.0)
    assert [(e.key, e.outcome, e.payload) for e in jb.expire()] == [(("c", "n"), NO_PREDICTION, "completion")]
    clock.advance(5.0)
    assert [(e.key, e.outcome) for e in jb.expire()] == [(("p", "n"), EXPIRED)]
    assert len(jb) == 0
    # after the TTL a redelivery is new again (bounded memory has a horizon)
    assert jb.add_completion(("m", "n"), 2).outcome == WAITING


def test_bounded_oldest_leave_first() -> None:
    clock = ManualClock(0.0)
    jb = JoinBuffer(ttl_s=100.0, max_entries=3, clock=clock)
    for i in range(5):
        jb.add_prediction((f"t{i}", "n"), i)
        clock.advance(1.0)
    gone = jb.expire()
    assert [e.key[0] for e in gone] == ["t0", "t1"] and len(jb) == 3


def test_changes_and_restore_round_trip() -> None:
    clock = ManualClock(0.0)
    jb = JoinBuffer(ttl_s=10.0, clock=clock)
    jb.add_completion(("a", "n"), {"rtt_ms": 1.0})
    jb.add_prediction(("b", "n"), {"predicted_rtt_ms": 2.0})
    jb.add_completion(("b", "n"), {"rtt_ms": 3.0})
    upserts, removed = jb.take_changes()
    assert set(upserts) == {("a", "n"), ("b", "n")} and removed == set()
    assert upserts[("b", "n")]["done"] is True and upserts[("b", "n")]["p"] is None
    assert jb.take_changes() == ({}, set())
    clock.advance(11.0)
    jb.expire()
    assert jb.take_changes() == ({}, {("a", "n"), ("b", "n")})

    restored = JoinBuffer(ttl_s=10.0, clock=ManualClock(5.0))
    restored.load(upserts)
    assert restored.add_completion(("b", "n"), {}).outcome == DUPLICATE
    assert restored.add_prediction(("a", "n"), {"predicted_rtt_ms": 1.0}).completion == {"rtt_ms": 1.0}


def test_a_held_value_lives_persists_and_leaves_with_its_key() -> None:
    clock = ManualClock(0.0)
    jb = JoinBuffer(ttl_s=10.0, clock=clock)
    jb.add_completion(("a", "n"), {"rtt_ms": 1.0})
    clock.advance(1.0)
    jb.add_completion(("b", "n"), {"rtt_ms": 2.0})
    jb.take_changes()
    jb.hold(("b", "n"), {"sample": "b"})
    jb.hold(("a", "n"), {"sample": "a"})
    assert jb.held() == [(("a", "n"), {"sample": "a"}), (("b", "n"), {"sample": "b"})]  # oldest key first
    upserts, _ = jb.take_changes()
    assert upserts[("a", "n")]["h"] == {"sample": "a"}
    # a match leaves the held value in place; a release takes it out, and the row changes again
    assert jb.add_prediction(("a", "n"), {"predicted_rtt_ms": 1.0}).outcome == MATCHED
    assert jb.held_value(("a", "n")) == {"sample": "a"}
    jb.release(("a", "n"))
    upserts, _ = jb.take_changes()
    assert "h" not in upserts[("a", "n")] and jb.held_keys == {("b", "n")}
    jb.release(("a", "n"))  # nothing held: no change
    assert jb.take_changes() == ({}, set())

    restored = JoinBuffer(ttl_s=10.0, clock=clock)
    restored.load({("b", "n"): jb.export(("b", "n"))})  # type: ignore[dict-item]
    assert restored.held() == [(("b", "n"), {"sample": "b"})]
    clock.advance(10.5)
    gone = [(e.key, e.outcome, e.payload) for e in restored.expire()]
    assert gone == [(("b", "n"), NO_PREDICTION, {"rtt_ms": 2.0}), (("b", "n"), HELD, {"sample": "b"})]
    assert restored.held() == [] and not restored.held_keys
    jb.drop(lambda k: False)
    assert jb.held() == []


def test_bad_settings() -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        JoinBuffer(ttl_s=0)
    with pytest.raises(ValueError, match="max_entries"):
        JoinBuffer(ttl_s=1, max_entries=0)


arrival = st.tuples(st.sampled_from(["c", "p"]), st.integers(0, 6), st.sampled_from(["n1", "n2"]),
                    st.floats(0.0, 4.0))


@settings(max_examples=200, deadline=None)
@given(st.lists(arrival, max_size=80), st.integers(1, 8))
def test_each_key_matches_at_most_once_and_every_arrival_is_accounted(events: list, cap: int) -> None:
    """Within the TTL: one match per key whatever the redeliveries; waiting + matched keys all leave once."""
    clock = ManualClock(0.0)
    jb = JoinBuffer(ttl_s=5.0, max_entries=cap, clock=clock)
    matched: list[tuple[str, str]] = []
    left: list[tuple[str, str]] = []
    waiting = 0
    for side, task, node, dt in events:
        clock.advance(dt)
        key = (f"t{task}", node)
        r = jb.add_completion(key, side) if side == "c" else jb.add_prediction(key, side)
        waiting += r.outcome == WAITING
        if r.outcome == MATCHED:
            matched.append(key)
            assert (r.completion, r.prediction) == ("c", "p")
        left.extend(e.key for e in jb.expire())
        assert len(jb) <= cap
    clock.advance(10.0)
    left.extend(e.key for e in jb.expire())
    assert len(jb) == 0
    # every first arrival ends as either a match or one expiry, never both, never twice
    assert waiting == len(matched) + len(left)


@settings(max_examples=100, deadline=None)
@given(st.lists(arrival, max_size=60))
def test_redeliveries_inside_the_ttl_never_match_twice(events: list) -> None:
    jb = JoinBuffer(ttl_s=1e9, clock=ManualClock(0.0))
    matched = [key for side, task, node, _ in events
               if (jb.add_completion if side == "c" else jb.add_prediction)((f"t{task}", node), side).outcome == MATCHED
               for key in [(task, node)]]
    assert len(matched) == len(set(matched))
    assert set(matched) == {(t, n) for s, t, n, _ in events if s == "c"} & {(t, n) for s, t, n, _ in events if s == "p"}
