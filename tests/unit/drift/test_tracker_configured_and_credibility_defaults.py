"""The tracker the worker and the simulator build from the settings carries each of them, and credibility keeps
the defaults docs/feedback.md gives (prior 0.5 worth 20 predictions, MAPE half-life 12 windows)."""

from __future__ import annotations

import pytest

from app.drift.credibility import Credibility
from app.drift.pagehinkley import PageHinkley
from app.drift.tracker import NodeTracker


def configured(jump: float) -> NodeTracker:
    return NodeTracker.configured(window_s=20.0, min_window_s=10.0, max_window_s=40.0, prior=0.3, drift_delta=0.05,
                                  drift_threshold=0.8, drift_min_instances=4, drift_jump=jump)


def test_each_feedback_setting_reaches_the_tracker() -> None:
    t = configured(jump=0.4)
    assert t.window("gCTF") == 20.0 and t.weight == 0.3
    t.add("gCTF", 100.0, 100.0)
    report = t.close(ts=0.0)["gCTF"]
    assert report.threshold == 0.8 and report.window_s == 20.0
    s = t.apps["gCTF"]
    assert isinstance(s.detector, PageHinkley)
    assert (s.detector.delta, s.detector.min_instances, s.detector.jump) == (0.05, 4, 0.4)
    assert (s.episode.delta, s.episode.threshold) == (0.05, 0.8)
    assert (s.dwa.min_s, s.dwa.max_s) == (10.0, 40.0)


def test_a_jump_of_zero_turns_the_level_shift_rule_off() -> None:
    t = configured(jump=0.0)
    t.add("gCTF", 100.0, 100.0)
    detector = t.apps["gCTF"].detector
    assert isinstance(detector, PageHinkley) and detector.jump is None


def test_windows_of_a_configured_tracker_stay_in_its_bounds() -> None:
    t = configured(jump=0.0)
    for k, actual in enumerate([110.0, 200.0, 400.0, 800.0, 1600.0, 3200.0]):
        t.add("gCTF", 100.0, actual)
        t.close(ts=float(k))
    assert t.window("gCTF") == 40.0  # grew ×1.5 on every rise, capped at max_window_s


def test_an_unseen_node_has_the_documented_prior() -> None:
    assert Credibility().weight == 0.5


def test_the_prior_is_worth_twenty_predictions() -> None:
    """20 predictions at 90 % accuracy against the prior 0.5 worth 20: half way, 0.7."""
    c = Credibility().update(0.10, n=20)
    assert c.weight == pytest.approx(0.7)


def test_the_mape_average_has_a_half_life_of_twelve_windows() -> None:
    c = Credibility().update(0.0, n=1)
    for _ in range(12):
        c.update(1.0, n=1)
    assert c.ewma_mape == pytest.approx(0.5)
