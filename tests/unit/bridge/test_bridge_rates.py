from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.bridge.rates import CounterTracker, Delta


def test_first_sighting_has_no_delta_then_increase_over_seconds():
    t = CounterTracker()
    assert t.observe({"a": 5.0, "b": 1.0}, 10.0, "bridge") == {"a": None, "b": None}
    out = t.observe({"a": 7.0, "b": 1.0}, 12.0, "bridge")
    assert out == {"a": Delta(2.0, 2.0), "b": Delta(0.0, 2.0)}
    assert out["a"].rate == 1.0


def test_a_drop_is_a_reset_skipped_once_and_counted():
    t = CounterTracker()
    t.observe({"a": 100.0}, 0.0, "bridge")
    assert t.observe({"a": 3.0}, 1.0, "bridge") == {"a": None}
    assert t.resets == 1
    assert t.observe({"a": 4.0}, 2.0, "bridge") == {"a": Delta(1.0, 1.0)}


def test_time_not_moving_forward_or_another_time_source_gives_no_delta():
    t = CounterTracker()
    t.observe({"a": 1.0}, 5.0, "bridge")
    assert t.observe({"a": 2.0}, 5.0, "bridge") == {"a": None}
    assert t.observe({"a": 3.0}, 1_800_000_000.0, "exporter") == {"a": None}
    assert t.observe({"a": 4.0}, 1_800_000_001.0, "exporter") == {"a": Delta(1.0, 1.0)}


def test_a_series_that_disappears_starts_over_when_it_returns():
    t = CounterTracker()
    t.observe({"a": 1.0}, 0.0, "bridge")
    t.observe({}, 1.0, "bridge")
    assert len(t) == 0
    assert t.observe({"a": 9.0}, 2.0, "bridge") == {"a": None}


@given(st.lists(st.tuples(st.floats(0, 1e6), st.booleans(), st.floats(0.01, 10)), min_size=2, max_size=40))
def test_deltas_add_up_to_the_counted_increase(steps):
    """Invariant: the increases reported equal the true increases of every interval without a reset."""
    t = CounterTracker()
    value, now = 0.0, 0.0
    t.observe({"c": value}, now, "bridge")
    expected = reported = 0.0
    for inc, reset, dt in steps:
        now += dt
        new = inc if reset else value + inc
        d = t.observe({"c": new}, now, "bridge")["c"]
        if new >= value:
            assert d is not None and abs(d.seconds - dt) < 1e-6
            expected += new - value
            reported += d.increase
        else:
            assert d is None
        value = new
    assert abs(reported - expected) <= 1e-6 * max(1.0, expected)
