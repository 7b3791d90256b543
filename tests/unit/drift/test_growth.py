"""SampleGrowth: cold start once (again only when the count doubles), then geometric growth retrains."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.drift.growth import COLD_START, GROWTH, Debounce, SampleGrowth, sample_check_s


def asks(g: SampleGrowth, counts: list[int], model_after: int | None) -> list[tuple[int, str]]:
    out = []
    for c in counts:
        has_model = model_after is not None and c > model_after
        reason = g.due("k", c, has_model=has_model)
        if reason is not None:
            g.asked("k", c)
            out.append((c, reason))
    return out


def test_cold_start_then_growth_by_half() -> None:
    g = SampleGrowth(cold_start=200, growth=0.5)
    assert asks(g, list(range(0, 1100)), model_after=250) == [
        (200, COLD_START), (300, GROWTH), (450, GROWTH), (675, GROWTH), (1013, GROWTH)]


def test_no_model_asks_again_only_when_doubled() -> None:
    g = SampleGrowth(cold_start=100, growth=0.5)
    assert asks(g, list(range(0, 1000)), model_after=None) == [(100, COLD_START), (200, COLD_START),
                                                               (400, COLD_START), (800, COLD_START)]


def test_growth_zero_is_off() -> None:
    g = SampleGrowth(cold_start=10, growth=0.0)
    assert asks(g, list(range(0, 500)), model_after=5) == []
    assert g.threshold("k", has_model=True) == math.inf


def test_a_model_from_before_a_restart_is_refreshed_after_growth_over_cold_start() -> None:
    g = SampleGrowth(cold_start=200, growth=0.5)
    assert asks(g, list(range(0, 400)), model_after=-1) == [(300, GROWTH)]


@pytest.mark.parametrize(("cold", "growth"), [(0, 0.5), (10, -0.1), (10, math.nan)])
def test_bad_parameters(cold: int, growth: float) -> None:
    with pytest.raises(ValueError):
        SampleGrowth(cold, growth)


@given(st.integers(1, 500), st.floats(0.05, 3.0), st.integers(1, 20_000))
def test_asks_are_geometric(cold: int, growth: float, n: int) -> None:
    g = SampleGrowth(cold, growth)
    out = asks(g, list(range(0, n, max(1, n // 2000))), model_after=0)
    counts = [c for c, _ in out]
    assert all(b >= (1 + growth) * a - 1e-9 for a, b in zip(counts, counts[1:], strict=False))
    assert len(out) <= 2 + math.log(max(n, 2) / cold + 1, 1 + growth) + 1


@pytest.mark.parametrize(("cold", "growth", "message"), [
    (0, 0.5, "cold_start must be >= 1 (got 0)"), (-3, 0.5, "cold_start must be >= 1 (got -3)"),
    (10, -0.1, "growth must be >= 0 (got -0.1)"), (10, math.nan, "growth must be >= 0 (got nan)"),
    (10, math.inf, "growth must be >= 0 (got inf)"),
])
def test_bad_parameters_say_which_and_the_value(cold: int, growth: float, message: str) -> None:
    with pytest.raises(ValueError) as err:
        SampleGrowth(cold, growth)
    assert str(err.value) == message


def test_the_least_parameters_are_accepted_and_kept() -> None:
    g = SampleGrowth(cold_start=1, growth=0.0)
    assert (g.cold_start, g.growth) == (1, 0.0)
    assert g.due("k", 0, has_model=False) is None and g.due("k", 1, has_model=False) == COLD_START
    g = SampleGrowth(cold_start=2, growth=0.25)
    assert (g.cold_start, g.growth) == (2, 0.25)


def test_thresholds_of_a_key_never_asked_and_after_an_ask() -> None:
    g = SampleGrowth(cold_start=200, growth=0.5)
    assert g.threshold("k", has_model=False) == 200.0 and g.threshold("k", has_model=True) == 300.0
    g.asked("k", 260)
    assert g.threshold("k", has_model=False) == 520.0 and g.threshold("k", has_model=True) == 390.0
    assert g.threshold("other", has_model=True) == 300.0  # per key
    assert g.due("k", 389, has_model=True) is None and g.due("k", 390, has_model=True) == GROWTH
    assert g.due("k", 519, has_model=False) is None and g.due("k", 520, has_model=False) == COLD_START


def test_small_growth_still_grows_from_cold_start() -> None:
    """A growth below 1 (0.01) is on; an ask at fewer samples than cold_start counts as cold_start."""
    g = SampleGrowth(cold_start=100, growth=0.01)
    assert g.threshold("k", has_model=True) == pytest.approx(101.0)
    g.asked("k", 1)
    assert g.threshold("k", has_model=True) == pytest.approx(101.0) and g.threshold("k", has_model=False) == 100.0


def test_forget_drops_only_the_keys_it_is_told() -> None:
    g = SampleGrowth(cold_start=10, growth=1.0)
    g.asked("old:gpu", 40)
    g.asked("new:gpu", 40)
    g.forget(lambda key: key.startswith("old:"))
    assert g.threshold("old:gpu", has_model=True) == 20.0  # from cold_start again
    assert g.threshold("new:gpu", has_model=True) == 80.0
    assert g.due("old:gpu", 10, has_model=False) == COLD_START and g.due("new:gpu", 10, has_model=False) is None


@pytest.mark.parametrize(("period", "check"), [(5.0, 0.25), (0.25, 0.25), (0.3, 0.25), (0.1, 0.1), (0.01, 0.01)])
def test_sample_check_is_a_quarter_second_or_the_error_period_when_shorter(period: float, check: float) -> None:
    assert sample_check_s(period) == check


def test_debounce_allows_one_drift_event_per_key_per_interval() -> None:
    d = Debounce(60.0)
    assert [d.allow("k", t) for t in (100.0, 100.0, 159.9, 160.0, 219.99, 220.0)] == [
        True, False, False, True, False, True]
    assert d.allow("other", 100.5) is True  # per key
    assert d.allow("k", 221.0, reason="drift") is False


def test_debounce_lets_other_reasons_through_without_restarting_the_interval() -> None:
    d = Debounce(60.0)
    assert d.allow("k", 0.0, reason="growth") is True and d.allow("k", 1.0, reason="growth") is True
    assert d.allow("k", 2.0, reason="cold_start") is True
    assert d.allow("k", 3.0) is True  # the first drift event of k, after three asks that were not debounced
    assert d.allow("k", 4.0, reason="growth") is True and d.allow("k", 62.0) is False
    assert d.allow("k", 63.0) is True


def test_debounce_of_chosen_reasons() -> None:
    d = Debounce(10.0, reasons=("drift", "growth"))
    assert d.allow("k", 0.0, reason="growth") is True and d.allow("k", 5.0, reason="drift") is False
    assert d.allow("k", 5.0, reason="cold_start") is True and d.allow("k", 10.0) is True
    assert Debounce(10.0, reasons=()).allow("k", 0.0) is True


def test_debounce_zero_interval_allows_every_event() -> None:
    d = Debounce(0.0)
    assert [d.allow("k", t) for t in (1.0, 1.0, 1.0)] == [True, True, True]


def test_debounce_forget_starts_the_keys_told_afresh() -> None:
    d = Debounce(60.0)
    assert d.allow("old:gpu", 0.0) and d.allow("new:gpu", 0.0)
    d.forget(lambda key: key.startswith("old:"))
    assert d.allow("old:gpu", 1.0) is True and d.allow("new:gpu", 1.0) is False
