"""Edges of the window adjustment's thresholds and of the join buffer's changelog that the other drift tests
leave open: the tolerance is relative to the threshold, of exactly ``TOLERANCE``, its edge included; a
waiting completion's changelog record carries no ``chosen``; ``drop`` leaves no change behind."""

from __future__ import annotations

import math

from app.clock import ManualClock
from app.drift.dwa import adjust_window
from app.drift.joinbuffer import JoinBuffer


def test_a_rise_exactly_at_the_tolerance_edge_grows_the_window_and_the_next_float_below_does_not() -> None:
    # (14.949999987 - 13) / 13 is exactly 0.15 - 1e-9 in doubles
    assert adjust_window(14.949999987, 13.0, 10.0) == 15.0
    assert adjust_window(math.nextafter(14.949999987, 0.0), 13.0, 10.0) == 10.0


def test_a_fall_exactly_at_the_tolerance_edge_shrinks_the_window_and_the_next_float_above_does_not() -> None:
    # (0.900000001 - 1) / 1 is exactly -0.1 + 1e-9 in doubles
    assert adjust_window(0.900000001, 1.0, 10.0) == 8.0
    assert adjust_window(math.nextafter(0.900000001, 1.0), 1.0, 10.0) == 10.0


def test_a_change_short_of_the_threshold_by_more_than_the_tolerance_leaves_the_window() -> None:
    # 1.5e-9 short of a 15 % rise / a 10 % fall: outside the 1e-9 slack
    assert adjust_window(114.99999985, 100.0, 10.0) == 10.0
    assert adjust_window(90.00000015, 100.0, 10.0) == 10.0


def test_the_tolerance_scales_with_a_threshold_above_1() -> None:
    # rise = 2 (RMSE tripled): the slack is 2e-9, so a change of 2 - 1.5e-9 still counts as the rise
    assert adjust_window(299.99999985, 100.0, 10.0, rise=2.0) == 15.0
    assert adjust_window(299.9999997, 100.0, 10.0, rise=2.0) == 10.0  # 3e-9 short: no rise


def test_a_waiting_completion_is_exported_without_chosen() -> None:
    jb = JoinBuffer(ttl_s=60.0, clock=ManualClock(100.0))
    jb.add_completion(("t1", "n1"), {"rtt_ms": 110.0})
    assert jb.export(("t1", "n1")) == {"since": 100.0, "c": {"rtt_ms": 110.0}, "p": None, "done": False}
    upserts, removed = jb.take_changes()
    assert upserts == {("t1", "n1"): jb.export(("t1", "n1"))} and removed == set()


def test_drop_forgets_a_restored_key_without_a_pending_deletion() -> None:
    clock = ManualClock(0.0)
    jb = JoinBuffer(ttl_s=10.0, clock=clock)
    jb.add_prediction(("t1", "n1"), {"predicted_rtt_ms": 50.0}, chosen=True)
    saved = jb.export(("t1", "n1"))
    assert saved is not None
    clock.advance(11.0)
    assert [e.outcome for e in jb.expire()] == ["expired"]  # its deletion is pending for the changelog
    jb.load({("t1", "n1"): saved})  # restored before the changelog was written
    assert jb.drop(lambda key: False) == 1
    assert jb.take_changes() == ({}, set())
