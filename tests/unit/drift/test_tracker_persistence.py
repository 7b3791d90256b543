"""A node tracker written to its changelog row and read back behaves as if it had never stopped."""

from __future__ import annotations

import random

import orjson
from hypothesis import given
from hypothesis import strategies as st

from app.drift.pagehinkley import PageHinkley
from app.drift.tracker import NodeTracker


def feed(t: NodeTracker, rng: random.Random, periods: range, scale: float) -> list[tuple[float, bool]]:
    out = []
    for k in periods:
        for _ in range(5):
            actual = 100.0 * scale
            t.add("gCTF", 100.0 * rng.uniform(0.95, 1.05), actual)
        r = t.close(ts=1000.0 + 5 * k)["gCTF"]
        out.append((round(r.cumulative, 9), r.drift))
    return out


def test_restored_detector_fires_on_the_same_period_as_the_original() -> None:
    a = NodeTracker()
    feed(a, random.Random(1), range(0, 20), 1.0)  # a reference of 20 healthy periods
    b = NodeTracker().load(orjson.loads(orjson.dumps(a.to_dict())))
    # the RTT doubles: the original and the restored tracker see the same periods
    after_a = feed(a, random.Random(2), range(20, 25), 2.0)
    after_b = feed(b, random.Random(2), range(20, 25), 2.0)
    assert after_a == after_b
    assert after_a[0][1]  # the first doubled period is a drift (level shift over a kept reference)


def test_a_fresh_tracker_would_not_have_fired() -> None:
    """What the restore buys: without the reference, the first doubled periods are only a start."""
    fresh = NodeTracker()
    assert not any(drift for _, drift in feed(fresh, random.Random(2), range(20, 25), 2.0))


@given(st.lists(st.floats(0.0, 2.0), min_size=1, max_size=60), st.lists(st.floats(0.0, 2.0), min_size=1,
                                                                          max_size=20))
def test_page_hinkley_round_trip(before: list[float], after: list[float]) -> None:
    a = PageHinkley()
    for x in before:
        a.update(x, ts=1.0)
    b = PageHinkley().load(orjson.loads(orjson.dumps(a.to_dict())))
    assert b.to_dict() == a.to_dict()
    for x in after:
        a.update(x, ts=2.0)
        b.update(x, ts=2.0)
        assert (a.cumulative, a.drift_detected, a.onset_ts, a.rule) == (b.cumulative, b.drift_detected, b.onset_ts,
                                                                         b.rule)
