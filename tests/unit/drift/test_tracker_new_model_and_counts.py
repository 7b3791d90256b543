"""NodeTracker when a new model serves an app, and what it counts and publishes of each app."""

from __future__ import annotations

import random

import pytest
from test_drift_tracker import feed  # periods of 10 gCTF pairs: actual = factor x predicted x (1 ± 5 %)

from app.drift.pagehinkley import PageHinkley
from app.drift.tracker import NodeTracker


def test_a_new_model_starts_the_drift_reference_afresh_and_keeps_working() -> None:
    """After a new model the doubled error is its reference: no alarm, and periods still close."""
    rng = random.Random(5)
    t = NodeTracker(30.0, detector=lambda: PageHinkley(min_instances=5))
    feed(t, rng, 10, 1.0, 0.0)
    assert t.new_model("gCTF") is True
    after = feed(t, rng, 10, 2.0, 100.0)
    assert not any(r.drift for r in after)


def test_a_new_model_of_an_app_never_seen_changes_nothing() -> None:
    t = NodeTracker()
    assert t.new_model("gCTF") is False
    assert t.apps == {} and t.correction("gCTF") == 1.0


def test_an_app_never_seen_has_no_samples() -> None:
    t = NodeTracker()
    assert t.samples("gCTF") == 0
    t.count_sample("gCTF")
    t.count_sample("gCTF")
    assert (t.samples("gCTF"), t.samples("upload")) == (2, 0)


def test_node_weights_fields_carry_the_credibility_and_the_counts() -> None:
    """The node-weights entry: ``weight`` is the node's credibility; ``samples`` and ``correction`` name only
    the apps that have some."""
    t = NodeTracker(prior=0.3)
    assert t.weights_fields() == {"weight": 0.3, "correction": {}, "samples": {}}
    t.add("gCTF", 100.0, 200.0)
    t.count_sample("upload")
    t.close(ts=1.0)
    f = t.weights_fields()
    assert set(f) == {"weight", "correction", "samples"}
    assert f["weight"] == t.weight != 0.3
    assert f["samples"] == {"upload": 1}
    assert set(f["correction"]) == {"gCTF"} and f["correction"]["gCTF"] > 1.0


def test_state_saved_before_samples_were_counted_loads_with_none() -> None:
    t = NodeTracker()
    t.add("gCTF", 100.0, 110.0)
    state = t.to_dict()
    del state["apps"]["gCTF"]["samples"]
    assert NodeTracker().load(state).samples("gCTF") == 0


def test_the_node_credibility_weighs_every_app_of_the_period() -> None:
    """Credibility is the node's: the same pairs give the same weight however they are split among apps."""
    pairs = [("gCTF", 100.0, 102.0)] * 10 + [("upload", 100.0, 160.0)] * 10
    split, one = NodeTracker(), NodeTracker()
    for app, predicted, actual in pairs:
        split.add(app, predicted, actual)
        one.add("gCTF", predicted, actual)
    split.close(ts=1.0)
    one.close(ts=1.0)
    assert split.weight == pytest.approx(one.weight)
    assert split.credibility.n == 20


def test_the_window_follows_the_rmse_of_the_period_not_its_mean_error() -> None:
    """Errors 10, 10, 10, 10 then 0, 0, 0, 24: the mean absolute error fell by 40 %, the RMSE rose by 20 %
    (one large miss weighs more than several small ones): the window grows ×1.5."""
    t = NodeTracker(20.0)
    for err in (10.0, 10.0, 10.0, 10.0):
        t.add("gCTF", 100.0, 100.0 + err)
    t.close(ts=1.0)
    for err in (0.0, 0.0, 0.0, 24.0):
        t.add("gCTF", 100.0, 100.0 + err)
    report = t.close(ts=2.0)["gCTF"]
    assert report.stats["rmse_ms"] == pytest.approx(12.0)
    assert report.window_s == t.window("gCTF") == 30.0
