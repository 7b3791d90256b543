"""Dynamic window adjustment: the seed's rule, exactly, and the bounds whatever the RMSE sequence."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.drift.dwa import DynamicWindow, adjust_window

rmse = st.one_of(st.floats(min_value=0.0, max_value=1e9), st.just(math.nan), st.just(math.inf), st.just(-1.0))


@pytest.mark.parametrize(("current", "prev", "window", "expected"), [
    (116.0, 100.0, 10.0, 15.0),     # +16 %: grow ×1.5
    (115.0, 100.0, 10.0, 15.0),     # exactly +15 %: a rise of 15 % or more grows
    (0.345, 0.3, 10.0, 15.0),       # exactly +15 % with rounding in the division
    (114.99, 100.0, 10.0, 10.0),    # just under +15 %: dead band
    (89.0, 100.0, 10.0, 8.0),       # -11 %: shrink ×0.8
    (90.0, 100.0, 10.0, 8.0),       # exactly -10 %: a fall of 10 % or more shrinks
    (0.27, 0.3, 10.0, 8.0),         # exactly -10 % with rounding in the division
    (90.01, 100.0, 10.0, 10.0),     # just under -10 %: dead band
    (200.0, 100.0, 50.0, 60.0),     # grow capped at max
    (10.0, 100.0, 6.0, 5.0),        # shrink floored at min
    (100.0, 0.0, 10.0, 10.0),       # no previous RMSE
    (math.nan, 100.0, 10.0, 10.0),
    (100.0, math.inf, 10.0, 10.0),
])
def test_seed_rule(current: float, prev: float, window: float, expected: float) -> None:
    assert adjust_window(current, prev, window) == pytest.approx(expected)


def test_custom_factors_are_used() -> None:
    assert adjust_window(130.0, 100.0, 10.0, grow=2.0, rise=0.2, max_s=100.0) == 20.0
    assert adjust_window(130.0, 100.0, 10.0, rise=0.5) == 10.0


@given(st.lists(rmse, max_size=60), st.floats(min_value=0.1, max_value=1e4))
def test_window_always_within_bounds(values: list[float], initial: float) -> None:
    dw = DynamicWindow(min_s=5.0, max_s=60.0, initial_s=initial)
    assert 5.0 <= dw.window_s <= 60.0
    for v in values:
        assert 5.0 <= dw.update(v).window_s <= 60.0


@given(rmse, rmse, st.floats(min_value=5.0, max_value=60.0))
def test_function_stays_within_bounds(current: float, prev: float, window: float) -> None:
    assert 5.0 <= adjust_window(current, prev, window) <= 60.0


def test_stateful_window_follows_the_rule_and_resets() -> None:
    dw = DynamicWindow(5.0, 60.0, 20.0)
    assert dw.update(100.0).window_s == 20.0  # first evaluation only sets the reference
    assert dw.update(130.0).window_s == 30.0
    assert dw.update(100.0).window_s == 24.0
    assert dw.update(-1.0).window_s == 24.0 and dw.last_rmse == 100.0
    dw._reset()
    assert dw.window_s == 20.0 and math.isnan(dw.last_rmse)


@pytest.mark.parametrize("kwargs", [
    {"min_s": 0.0}, {"min_s": 10.0, "max_s": 5.0}, {"initial_s": -1.0}, {"grow": 0.5}, {"shrink": 1.5},
    {"rise": -0.1}, {"max_s": math.inf},
])
def test_bad_settings_raise(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        DynamicWindow(**kwargs)
