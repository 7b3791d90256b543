"""NodeTracker: per-period errors, DWA windows, drift on a doubling, credibility, restore."""

from __future__ import annotations

import random

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.drift.errorstats import ErrorStats
from app.drift.pagehinkley import PageHinkley
from app.drift.tracker import NodeTracker


def feed(t: NodeTracker, rng: random.Random, periods: int, factor: float, ts0: float) -> list:
    """Periods of 10 pairs each: actual = factor x predicted x (1 ± 5 %)."""
    out = []
    for k in range(periods):
        for _ in range(10):
            p = rng.uniform(100.0, 200.0)
            t.add("gCTF", p, p * factor * rng.uniform(0.95, 1.05))
        out.append(t.close(ts0 + k)["gCTF"])
    return out


def test_doubling_is_detected_with_an_onset_after_the_change() -> None:
    rng = random.Random(3)
    t = NodeTracker(30.0, detector=lambda: PageHinkley(min_instances=5))
    calm = feed(t, rng, 20, 1.0, 0.0)
    assert not any(r.drift for r in calm)
    hot = feed(t, rng, 10, 2.0, 100.0)
    fired = [r for r in hot if r.drift]
    assert fired and fired[0].cumulative > fired[0].threshold
    assert fired[0].onset_ts is not None and 19.0 <= fired[0].onset_ts <= 100.0
    assert hot[0].window_s == min(60.0, calm[-1].window_s * 1.5)  # RMSE rose far more than 15 %: x1.5


def test_weight_falls_when_the_node_gets_less_accurate() -> None:
    rng = random.Random(4)
    t = NodeTracker(30.0)
    feed(t, rng, 12, 1.0, 0.0)
    good = t.weight
    feed(t, rng, 12, 2.0, 100.0)
    assert 0.5 < good and t.weight < good


def test_reset_detector_starts_a_fresh_reference() -> None:
    rng = random.Random(5)
    t = NodeTracker(30.0, detector=lambda: PageHinkley(min_instances=5))
    feed(t, rng, 10, 1.0, 0.0)
    assert t.reset_detector("gCTF") and not t.reset_detector("other")
    after = feed(t, rng, 10, 2.0, 100.0)  # the new model's error is the reference: no alarm
    assert not any(r.drift for r in after)


def test_empty_period_reports_nothing_and_keeps_the_weight() -> None:
    t = NodeTracker(30.0, prior=0.3)
    assert t.close(0.0) == {} and t.weight == 0.3 and t.window("gCTF") == 30.0


def test_restore_round_trip_through_json() -> None:
    rng = random.Random(6)
    t = NodeTracker(30.0)
    feed(t, rng, 4, 1.5, 0.0)
    t.add("gCTF", 100.0, 150.0)  # an open period survives too
    back = NodeTracker(30.0).load(orjson.loads(orjson.dumps(t.to_dict())))
    assert back.windows() == t.windows() and back.weight == pytest.approx(t.weight)
    assert back.pending() == 1 and back.close(9.0)["gCTF"].stats == t.close(9.0)["gCTF"].stats


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(1.0, 1e4), st.floats(1.0, 1e4), st.booleans()), max_size=60))
def test_periods_partition_the_pairs(pairs: list) -> None:
    """However pairs are split into periods, the periods' sums add up to the batch statistics."""
    t = NodeTracker(30.0, min_window_s=5.0, max_window_s=60.0)
    total, merged = ErrorStats(), ErrorStats()
    for k, (p, a, cut) in enumerate(pairs):
        t.add("gCTF", p, a)
        total.update(p, a)
        if cut:
            for r in t.close(float(k)).values():
                merged = merged + r.errors
                assert 5.0 <= r.window_s <= 60.0
    for r in t.close(1e6).values():
        merged = merged + r.errors
    assert merged.n == total.n and merged.sum_sq_err == pytest.approx(total.sum_sq_err)


def test_a_drift_the_new_model_does_not_fix_is_signalled_again() -> None:
    rng = random.Random(7)
    t = NodeTracker(30.0, detector=lambda: PageHinkley(min_instances=5))
    feed(t, rng, 20, 1.0, 0.0)
    first = next(r for r in feed(t, rng, 10, 2.0, 100.0) if r.drift)
    t.reset_detector("gCTF")  # a retrained model serves, no better than the old one
    again = [r for r in feed(t, rng, 6, 2.0, 200.0) if r.drift]
    assert again and again[0].cumulative > again[0].threshold and again[0].onset_ts == first.onset_ts
    t.reset_detector("gCTF")  # a model that fixes it: the episode closes, no more alarms
    assert not any(r.drift for r in feed(t, rng, 20, 1.0, 300.0))


def test_episode_settings_are_checked() -> None:
    from app.drift.episode import DriftEpisode

    for bad in ({"delta": -1.0}, {"threshold": 0.0}, {"calm": 0}, {"half_life": 0.0}):
        with pytest.raises(ValueError):
            DriftEpisode(**bad)  # type: ignore[arg-type]
