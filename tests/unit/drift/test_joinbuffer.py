"""The join buffer: either side first, TTL expiry, duplicates counted once, bounded (spares first), restorable."""

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


def test_past_the_bound_spare_predictions_leave_before_an_older_chosen_one() -> None:
    """A pod is predicted on every candidate and runs on one: the prediction for the node the extender chose stays
    while the others (spares) leave, oldest first, even when it is older than all of them."""
    clock = ManualClock(0.0)
    jb = JoinBuffer(ttl_s=100.0, max_entries=3, clock=clock)
    for task in ("t0", "t1"):
        jb.add_prediction((task, "n0"), f"{task}@n0", chosen=True)
        clock.advance(1.0)
        for node in ("n1", "n2"):
            jb.add_prediction((task, node), f"{task}@{node}")
            clock.advance(1.0)
    gone = jb.expire()
    assert [(e.key, e.outcome, e.payload) for e in gone] == [
        (("t0", "n1"), EXPIRED, "t0@n1"), (("t0", "n2"), EXPIRED, "t0@n2"), (("t1", "n1"), EXPIRED, "t1@n1")]
    assert list(jb.keys()) == [("t0", "n0"), ("t1", "n0"), ("t1", "n2")]
    assert jb.add_completion(("t0", "n0"), "done").prediction == "t0@n0"
    assert jb.add_completion(("t1", "n2"), "elsewhere").prediction == "t1@n2"  # a spare still matches while there


def test_with_no_spare_left_the_oldest_key_leaves_whatever_it_holds() -> None:
    clock = ManualClock(0.0)
    jb = JoinBuffer(ttl_s=100.0, max_entries=2, clock=clock)
    jb.add_prediction(("a", "n"), "a", chosen=True)
    jb.add_completion(("a", "n"), "a done")  # a done key, the oldest
    clock.advance(1.0)
    jb.add_completion(("b", "n"), "b waits")
    clock.advance(1.0)
    jb.add_prediction(("c", "n"), "c", chosen=True)
    clock.advance(1.0)
    jb.add_prediction(("d", "n"), "d")  # the only spare
    clock.advance(1.0)
    jb.add_prediction(("e", "n"), "e", chosen=True)
    gone = jb.expire()  # three over: the spare, then the oldest two keys (the done one silently)
    assert [(e.key, e.outcome) for e in gone] == [(("d", "n"), EXPIRED), (("b", "n"), NO_PREDICTION)]
    assert list(jb.keys()) == [("c", "n"), ("e", "n")]
    jb.add_prediction(("f", "n"), "f", chosen=True)
    assert [(e.key, e.outcome) for e in jb.expire()] == [(("c", "n"), EXPIRED)]  # only chosen ones: the oldest


def test_a_matched_spare_is_no_longer_a_spare_and_either_side_may_come_first() -> None:
    clock = ManualClock(0.0)
    jb = JoinBuffer(ttl_s=100.0, max_entries=3, clock=clock)
    jb.add_prediction(("a", "n1"), "a@n1")  # a spare, then its pod's completion there: matched, done
    assert jb.add_completion(("a", "n1"), "a done").outcome == MATCHED
    clock.advance(1.0)
    jb.add_completion(("b", "n2"), "b done")  # the completion first, then a spare prediction for it
    assert jb.add_prediction(("b", "n2"), "b@n2").outcome == MATCHED
    clock.advance(1.0)
    jb.add_prediction(("c", "n1"), "c@n1")
    clock.advance(1.0)
    jb.add_prediction(("c", "n2"), "c@n2", chosen=True)
    assert [(e.key, e.outcome) for e in jb.expire()] == [(("c", "n1"), EXPIRED)]  # not the older done keys
    assert jb.add_prediction(("a", "n1"), "a@n1").outcome == DUPLICATE
    jb.add_prediction(("d", "n1"), "d@n1", chosen=True)
    assert [(e.key, e.outcome) for e in jb.expire()] == []  # no spare left: the oldest key, done, leaves silently
    assert ("a", "n1") not in jb and len(jb) == 3


def test_a_chosen_copy_of_a_waiting_spare_makes_it_chosen() -> None:
    """A pod decided again (retried) may be expected on a node it had a spare prediction for."""
    clock = ManualClock(0.0)
    jb = JoinBuffer(ttl_s=100.0, max_entries=2, clock=clock)
    jb.add_prediction(("t", "n1"), "first")
    jb.take_changes()
    clock.advance(1.0)
    assert jb.add_prediction(("t", "n1"), "again", chosen=True).outcome == DUPLICATE
    assert jb.take_changes()[0] == {("t", "n1"): {"since": 0.0, "c": None, "p": "first", "done": False,
                                                  "chosen": True}}
    jb.add_prediction(("t", "n2"), "spare")
    jb.add_prediction(("u", "n1"), "spare")
    assert [e.key for e in jb.expire()] == [("t", "n2")]
    assert jb.add_completion(("t", "n1"), "done").prediction == "first"


def test_the_chosen_mark_survives_export_and_load() -> None:
    clock = ManualClock(0.0)
    jb = JoinBuffer(ttl_s=100.0, clock=clock)
    jb.add_prediction(("t", "n0"), {"predicted_rtt_ms": 1.0}, chosen=True)
    clock.advance(1.0)
    jb.add_prediction(("t", "n1"), {"predicted_rtt_ms": 2.0})
    upserts, _ = jb.take_changes()
    assert upserts[("t", "n0")]["chosen"] is True and "chosen" not in upserts[("t", "n1")]

    restored = JoinBuffer(ttl_s=100.0, max_entries=2, clock=clock)
    restored.load(upserts)
    restored.add_prediction(("u", "n0"), {"predicted_rtt_ms": 3.0}, chosen=True)
    assert [e.key for e in restored.expire()] == [("t", "n1")]  # the restored spare, not the older chosen one
    assert restored.export(("t", "n0")) == upserts[("t", "n0")]
    # an entry exported before the mark existed has none: it loads as a spare
    older = JoinBuffer(ttl_s=100.0, max_entries=1, clock=clock)
    older.load({("v", "n0"): {"since": 0.5, "c": None, "p": {"predicted_rtt_ms": 4.0}, "done": False},
                ("t", "n0"): upserts[("t", "n0")]})
    assert [e.key for e in older.expire()] == [("v", "n0")]


def test_dropped_keys_leave_the_spares_too() -> None:
    clock = ManualClock(0.0)
    jb = JoinBuffer(ttl_s=100.0, max_entries=2, clock=clock)
    for task in ("a", "b", "c"):
        jb.add_prediction((task, "n1"), task)
        jb.add_prediction((task, "n2"), task, chosen=True)
        clock.advance(1.0)
    assert jb.drop(lambda key: key[1] != "n1") == 3  # a rebalance took n1's partition: its spares go with it
    jb.add_prediction(("d", "n2"), "d")
    assert [(e.key, e.outcome) for e in jb.expire()] == [(("d", "n2"), EXPIRED), (("a", "n2"), EXPIRED)]


def _reference(events: list, cap: int, ttl: float) -> list[list[tuple[tuple[str, str], str]]]:
    """The rule spelt out on a list: TTL first, then spares oldest first, then the oldest keys."""
    now, keys, out = 0.0, [], []  # keys: [key, since, state, chosen] by arrival
    for side, task, node, dt, chosen in events:
        now += dt
        key = (f"t{task}", node)
        row = next((r for r in keys if r[0] == key), None)
        if row is None:
            keys.append([key, now, side, side == "p" and chosen])
        elif row[2] not in (side, "done"):
            row[2], row[3] = "done", False
        elif side == "p" and chosen and row[2] == "p":
            row[3] = True
        gone = [r for r in keys if r[1] <= now - ttl]
        keys = [r for r in keys if r[1] > now - ttl]
        over = len(keys) - cap
        spares = [r for r in keys if r[2] == "p" and not r[3]][:max(over, 0)]
        keys = [r for r in keys if r not in spares]
        oldest = keys[:max(over - len(spares), 0)]
        keys = keys[len(oldest):]
        out.append([(r[0], {"c": NO_PREDICTION, "p": EXPIRED}[r[2]]) for r in gone + spares + oldest
                    if r[2] != "done"])
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["c", "p"]), st.integers(0, 6), st.sampled_from(["n1", "n2", "n3"]),
                          st.floats(0.0, 2.0), st.booleans()), max_size=80),
       st.integers(1, 8), st.booleans())
def test_what_leaves_and_when_follows_the_rule(events: list, cap: int, restore: bool) -> None:
    """Against the rule on a plain list, whatever the order, redeliveries and marks; with ``restore`` the buffer
    goes through export/load after every arrival (a restart at each step)."""
    clock = ManualClock(0.0)
    jb = JoinBuffer(ttl_s=5.0, max_entries=cap, clock=clock)
    got = []
    for side, task, node, dt, chosen in events:
        clock.advance(dt)
        key = (f"t{task}", node)
        jb.add_completion(key, side) if side == "c" else jb.add_prediction(key, side, chosen=chosen)
        if restore:
            again = JoinBuffer(ttl_s=5.0, max_entries=cap, clock=clock)
            again.load({k: d for k in jb.keys() if (d := jb.export(k)) is not None})
            jb = again
        got.append([(e.key, e.outcome) for e in jb.expire()])
    assert got == _reference(events, cap, 5.0)
