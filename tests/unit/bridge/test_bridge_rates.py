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


def test_a_page_of_another_host_gives_no_delta_and_is_not_a_reset():
    t = CounterTracker()
    t.observe({"a": 100.0, "b": 5.0}, 0.0, "bridge")
    assert t.observe({"a": 7.0, "b": 900.0}, 1.0, "bridge", other_host=True) == {"a": None, "b": None}
    assert (t.skipped, t.host_changes, t.resets) == ("host_changed", 1, 0)
    assert t.observe({"a": 8.0, "b": 901.0}, 2.0, "bridge") == {"a": Delta(1.0, 1.0), "b": Delta(1.0, 1.0)}


def test_counters_back_and_forth_are_skipped_but_a_restart_that_regrows_a_small_counter_is_not():
    t = CounterTracker()
    t.observe({"cpu": 5000.0, "errs": 2.0}, 0.0, "bridge")
    t.observe({"cpu": 3.0, "errs": 0.0}, 1.0, "bridge")  # restarted: both went back
    assert t.observe({"cpu": 4.0, "errs": 2.0}, 2.0, "bridge") == {"cpu": Delta(1.0, 1.0), "errs": Delta(2.0, 1.0)}
    assert t.bounces == 0  # errs is back at 2, but most of what reset (cpu) did not come back
    t.observe({"cpu": 1.0, "errs": 0.0}, 3.0, "bridge")  # another counter answered
    assert t.observe({"cpu": 6.0, "errs": 3.0}, 4.0, "bridge") == {"cpu": None, "errs": None}
    assert (t.skipped, t.bounces) == ("counter_bounce", 1)


def test_a_series_that_disappears_starts_over_when_it_returns():
    t = CounterTracker()
    t.observe({"a": 1.0}, 0.0, "bridge")
    t.observe({}, 1.0, "bridge")
    assert len(t) == 0
    assert t.observe({"a": 9.0}, 2.0, "bridge") == {"a": None}


@given(st.lists(st.tuples(st.floats(0, 1e6), st.booleans(), st.floats(0.01, 10)), min_size=2, max_size=40))
def test_deltas_add_up_to_the_counted_increase(steps):
    """Invariant: the increases reported equal the true increases of every interval without a reset, except one
    right after a reset that is back at or above the value before it (back and forth: skipped)."""
    t = CounterTracker()
    value, now = 0.0, 0.0
    t.observe({"c": value}, now, "bridge")
    expected = reported = 0.0
    reset_from = None  # the value before a reset in the previous interval
    for inc, reset, dt in steps:
        now += dt
        new = inc if reset else value + inc
        d = t.observe({"c": new}, now, "bridge")["c"]
        if reset_from is not None and new >= reset_from:
            assert d is None and t.skipped == "counter_bounce"
            reset_from = None
        elif new >= value:
            assert d is not None and abs(d.seconds - dt) < 1e-6
            expected += new - value
            reported += d.increase
            reset_from = None
        else:
            assert d is None
            reset_from = value
        value = new
    assert abs(reported - expected) <= 1e-6 * max(1.0, expected)
