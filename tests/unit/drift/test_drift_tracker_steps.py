"""NodeTracker and JoinBuffer details: window bounds, several apps, times, reports, restored state and order."""

from __future__ import annotations

import json

import pytest

from app.clock import ManualClock
from app.drift.joinbuffer import EXPIRED, NO_PREDICTION, JoinBuffer
from app.drift.pagehinkley import PageHinkley
from app.drift.tracker import NodeTracker


def pairs(t: NodeTracker, app: str, error: float, n: int = 4) -> None:
    for _ in range(n):
        t.add(app, 100.0, 100.0 + error)  # RMSE = |error|, MAPE = |error| / (100 + error)


def test_windows_start_clamped_to_the_tracker_bounds() -> None:
    assert NodeTracker().window("gCTF") == 30.0 and NodeTracker(initial_window_s=1.0).window("gCTF") == 5.0
    t = NodeTracker(initial_window_s=100.0, min_window_s=10.0, max_window_s=40.0)
    assert t.window("gCTF") == 40.0
    pairs(t, "gCTF", 10.0)
    assert t.close(1.0)["gCTF"].window_s == 40.0 and t.window("gCTF") == 40.0
    for error, window in ((1.0, 32.0), (0.5, 25.6), (0.25, 20.48), (0.125, 16.384), (0.0625, 13.1072),
                          (0.03125, 10.48576), (0.015625, 10.0)):
        pairs(t, "gCTF", error)  # RMSE halves each period: x0.8, never below min_window_s
        assert t.close(1.0)["gCTF"].window_s == pytest.approx(window) and t.window("gCTF") == pytest.approx(window)
    assert t.windows() == {"gCTF": 10.0}


def test_an_idle_app_does_not_stop_the_others_and_times_reach_the_detector() -> None:
    t = NodeTracker(detector=lambda: PageHinkley(delta=0.0, jump=None))
    pairs(t, "upload", 10.0)
    pairs(t, "gCTF", 10.0)
    t.close(1000.0)
    pairs(t, "gCTF", 10.0)  # upload idle in this period, and first in the tracker's order
    reports = t.close(1005.0)
    assert list(reports) == ["gCTF"] and reports["gCTF"].onset_ts == 1005.0
    assert reports["gCTF"].stats["n"] == 4 and reports["gCTF"].errors.n == 4 and reports["gCTF"].window_s == 30.0


def test_a_persisting_drift_is_reported_with_the_period_figures() -> None:
    t = NodeTracker(detector=lambda: PageHinkley(min_instances=3))
    for k in range(6):
        pairs(t, "gCTF", 5.0)
        t.close(float(k))
    pairs(t, "gCTF", 100.0)
    assert t.close(6.0)["gCTF"].drift  # level shift: MAPE 0.05 -> 0.5
    t.reset_detector("gCTF")  # a retrained model, no better: the error stays high
    again = []
    for k in range(7, 12):
        pairs(t, "gCTF", 100.0)
        again.append(t.close(float(k))["gCTF"])
    r = next(r for r in again if r.drift)
    assert r.cumulative > r.threshold and r.onset_ts is not None
    assert r.stats["n"] == 4 and r.stats["rmse_ms"] == 100.0 and r.errors.n == 4
    assert r.window_s == t.window("gCTF")


def test_restored_tracker_keeps_the_reference_rmse_of_dwa() -> None:
    t = NodeTracker()
    pairs(t, "gCTF", 10.0)
    t.close(1.0)
    state = json.loads(json.dumps(t.to_dict()))
    assert state["apps"]["gCTF"]["rmse"] == 10.0
    r = NodeTracker().load(state)
    for tracker in (t, r):
        pairs(tracker, "gCTF", 20.0)  # RMSE doubles against the restored reference: the window grows
        assert tracker.close(2.0)["gCTF"].window_s == 45.0
    assert r.to_dict() == t.to_dict()


def test_restored_join_entries_keep_their_age_order_and_predictions() -> None:
    clock = ManualClock(100.0)
    jb = JoinBuffer(ttl_s=50.0, max_entries=2, clock=clock)
    jb.load({("z", "n"): {"since": 10.0, "p": {"predicted_rtt_ms": 1.0}},  # oldest, though last by name
             ("a", "n"): {"since": 80.0, "c": {"rtt_ms": 2.0}},
             ("m", "n"): {"since": 90.0, "p": {"predicted_rtt_ms": 3.0}}})
    assert list(jb.keys()) == [("z", "n"), ("a", "n"), ("m", "n")]
    assert jb.export(("m", "n")) == {"since": 90.0, "c": None, "p": {"predicted_rtt_ms": 3.0}, "done": False}
    gone = jb.expire()
    assert [(e.key, e.outcome, e.payload) for e in gone] == [(("z", "n"), EXPIRED, {"predicted_rtt_ms": 1.0})]
    assert jb.add_completion(("m", "n"), {"rtt_ms": 4.0}).prediction == {"predicted_rtt_ms": 3.0}
    clock.advance(35.0)
    assert [(e.key, e.outcome) for e in jb.expire()] == [(("a", "n"), NO_PREDICTION)]


def test_changes_follow_every_arrival_and_departure() -> None:
    clock = ManualClock(0.0)
    jb = JoinBuffer(ttl_s=10.0, clock=clock)
    jb.add_prediction(("a", "n"), {"predicted_rtt_ms": 1.0})
    upserts, removed = jb.take_changes()
    assert upserts == {("a", "n"): {"since": 0.0, "c": None, "p": {"predicted_rtt_ms": 1.0}, "done": False}}
    clock.advance(11.0)
    jb.expire()
    jb.add_prediction(("a", "n"), {"predicted_rtt_ms": 2.0})  # back after it left: changed, not removed
    upserts, removed = jb.take_changes()
    assert set(upserts) == {("a", "n")} and removed == set()


def test_restored_tracker_keeps_a_moved_window() -> None:
    t = NodeTracker()
    for error in (10.0, 20.0):
        pairs(t, "gCTF", error)
        t.close(1.0)
    assert t.window("gCTF") == 45.0
    r = NodeTracker().load(json.loads(json.dumps(t.to_dict())))
    assert r.window("gCTF") == 45.0 and r.to_dict() == t.to_dict()


def test_a_match_is_a_change_even_after_the_arrival_was_taken() -> None:
    jb = JoinBuffer(ttl_s=10.0, clock=ManualClock(0.0))
    jb.add_completion(("a", "n"), {"rtt_ms": 1.0})
    jb.take_changes()
    jb.add_prediction(("a", "n"), {"predicted_rtt_ms": 1.0})
    upserts, removed = jb.take_changes()
    assert upserts == {("a", "n"): {"since": 0.0, "c": None, "p": None, "done": True}} and removed == set()


def test_drop_forgets_keys_without_outcomes_or_changes() -> None:
    jb = JoinBuffer(ttl_s=10.0, clock=ManualClock(0.0))
    for task in ("a", "b", "c"):
        jb.add_prediction((task, "n1" if task != "b" else "n2"), {"predicted_rtt_ms": 1.0})
    gone = jb.drop(lambda key: key[1] == "n1")  # partition of n2 lost: its keys go, silently
    assert gone == 1 and list(jb.keys()) == [("a", "n1"), ("c", "n1")]
    upserts, removed = jb.take_changes()
    assert set(upserts) == {("a", "n1"), ("c", "n1")} and removed == set()
    assert jb.add_completion(("b", "n2"), {"rtt_ms": 1.0}).outcome == "waiting"
