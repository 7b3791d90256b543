"""Credibility and DWA at their boundaries, with hand-computed values (binary fractions where equality matters)."""

from __future__ import annotations

import math

import pytest

from app.drift.credibility import Credibility, credibility
from app.drift.dwa import DynamicWindow, adjust_window


@pytest.mark.parametrize(("accuracy", "n", "kwargs", "want"), [
    (0.75, 1.0, {"prior": 0.25, "n0": 1.0}, 0.5),  # one prediction against a prior worth one
    (0.75, 3.0, {"prior": 0.25, "n0": 1.0}, 0.625),
    (0.75, math.inf, {}, 0.75),  # infinite evidence: the accuracy itself
    (0.75, -math.inf, {"prior": 0.25}, 0.25),  # no evidence
    (0.75, math.nan, {"prior": 0.25}, 0.25),
    (0.75, -3.0, {"prior": 0.25}, 0.25),
    (0.75, 5.0, {"prior": 0.25, "n0": 0.0}, 0.75),  # a prior worth nothing
    (0.75, 0.0, {"prior": 0.25, "n0": 0.0}, 0.25),  # ... and no evidence: still the prior
    (1.5, 1.0, {"prior": -1.0, "n0": 1.0}, 0.5),  # accuracy and prior clamped to [0, 1]
    (math.nan, 1.0, {"prior": 1.0, "n0": 1.0}, 0.5),  # NaN accuracy counts as 0
])
def test_credibility_by_hand(accuracy: float, n: float, kwargs: dict[str, float], want: float) -> None:
    assert credibility(accuracy, n, **kwargs) == want


def test_a_period_counts_only_with_predictions_and_a_usable_mape() -> None:
    c = Credibility(prior=0.5, half_life=1.0, n0=1.0)
    for mape, n in ((0.5, 0), (0.5, -1), (math.nan, 5), (math.inf, 5), (-0.25, 5)):
        c.update(mape, n)
        assert c.ewma_mape is None and c.n == 0 and c.weight == 0.5
    c.update(0.5, 1)  # one prediction counts
    assert (c.ewma_mape, c.n, c.accuracy, c.weight) == (0.5, 1, 0.5, 0.5)
    c.update(0.0, 1)  # half-life 1: half-way; a perfect period is usable
    assert (c.ewma_mape, c.n, c.accuracy) == (0.25, 2, 0.75)
    assert c.weight == pytest.approx((0.5 + 2 * 0.75) / 3)


def test_credibility_state_round_trip_and_bad_states() -> None:
    c = Credibility().load({"ewma_mape": 0.0, "n": 0})  # zero is a valid MAPE and count
    assert c.to_dict() == {"ewma_mape": 0.0, "n": 0} and Credibility().load({}).to_dict() == Credibility().to_dict()
    for bad in ({"n": -1}, {"ewma_mape": -0.1, "n": 3}, {"ewma_mape": math.nan, "n": 3}):
        with pytest.raises(ValueError, match="bad credibility state"):
            Credibility().load(bad)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"prior": -0.01}, "prior"), ({"prior": 1.01}, "prior"), ({"half_life": 0.0}, "half_life"),
    ({"half_life": math.inf}, "half_life"), ({"n0": -1.0}, "n0"), ({"n0": math.nan}, "n0"),
])
def test_credibility_settings(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field} must be"):
        Credibility(**kwargs)


def test_credibility_limit_settings_are_accepted() -> None:
    assert Credibility(prior=0.0).weight == 0.0 and Credibility(prior=1.0).weight == 1.0
    assert Credibility(half_life=0.5, n0=0.0).update(0.25, 1).weight == 0.75


def test_adjust_window_on_small_rmse_values() -> None:
    assert adjust_window(0.75, 0.5, 10.0) == 15.0  # +50 % on sub-millisecond RMSE still grows
    assert adjust_window(0.25, 0.5, 10.0) == 8.0
    assert adjust_window(1.0, math.nan, 10.0) == 10.0 and adjust_window(math.inf, 1.0, 10.0) == 10.0
    assert adjust_window(1.0, -1.0, 10.0) == 10.0


def test_dynamic_window_uses_its_own_settings() -> None:
    dw = DynamicWindow(min_s=8.0, max_s=20.0, initial_s=10.0, grow=3.0, shrink=0.5, rise=0.5, fall=0.25)
    steps = [(1.0, 10.0), (1.25, 10.0), (2.0, 20.0), (1.75, 20.0), (1.0, 10.0), (0.5, 8.0)]
    for rmse, window in steps:  # +25 % inside the band, +60 % grows x3 to the cap, -12.5 % stays, -43 % halves
        assert dw.update(rmse).window_s == window
    assert dw.last_rmse == 0.5


def test_dynamic_window_takes_zero_and_sub_unit_rmse() -> None:
    dw = DynamicWindow(initial_s=10.0)
    dw.update(0.5).update(0.25)  # -50 %: shrinks x0.8
    assert dw.window_s == 8.0 and dw.last_rmse == 0.25
    dw.update(0.0)
    assert dw.last_rmse == 0.0 and dw.window_s == 6.4
    dw.update(-1.0).update(math.nan)
    assert dw.last_rmse == 0.0


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"min_s": 0.0}, "min_s"), ({"min_s": 10.0, "max_s": 9.0}, "min_s must be <= max_s"),
    ({"initial_s": 0.0}, "initial_s"), ({"grow": 0.99}, "grow"), ({"shrink": 0.0}, "shrink"),
    ({"shrink": 1.01}, "shrink"), ({"rise": -0.1}, "rise and fall"), ({"fall": -0.1}, "rise and fall"),
])
def test_dynamic_window_settings(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}"):
        DynamicWindow(**kwargs)


def test_dynamic_window_limit_settings_are_accepted() -> None:
    dw = DynamicWindow(min_s=0.5, max_s=0.5, initial_s=30.0, grow=1.0, shrink=1.0, rise=0.0, fall=0.0)
    assert dw.window_s == 0.5 and dw.update(1.0).update(2.0).window_s == 0.5
    assert DynamicWindow().window_s == 30.0
