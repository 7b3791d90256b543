"""Credibility: in [0, 1], the prior for an unseen node, monotone in accuracy, following recent MAPE."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.drift.credibility import Credibility, credibility

unit = st.floats(min_value=0.0, max_value=1.0)
anything = st.floats(allow_nan=True, allow_infinity=True)
counts = st.floats(min_value=0.0, max_value=1e9)


@given(anything, st.one_of(counts, st.just(math.inf), st.just(math.nan), st.just(-5.0)), anything,
       st.floats(min_value=0.0, max_value=1e6))
def test_always_in_unit_interval(a: float, n: float, prior: float, n0: float) -> None:
    w = credibility(a, n, prior, n0)
    assert 0.0 <= w <= 1.0


@given(unit, unit, counts, unit, st.floats(min_value=0.0, max_value=1e6))
def test_monotone_in_accuracy(a1: float, a2: float, n: float, prior: float, n0: float) -> None:
    lo, hi = sorted((a1, a2))
    assert credibility(lo, n, prior, n0) <= credibility(hi, n, prior, n0) + 1e-12


@given(st.lists(st.tuples(st.floats(min_value=0.0, max_value=5.0), st.integers(0, 50)), max_size=30),
       st.floats(min_value=0.0, max_value=5.0), st.floats(min_value=0.0, max_value=5.0))
def test_lower_recent_error_never_lowers_the_weight(history: list[tuple[float, int]], m1: float, m2: float) -> None:
    better, worse = Credibility(), Credibility()
    for mape, n in history:
        better.update(mape, n)
        worse.update(mape, n)
    better.update(min(m1, m2), 10)
    worse.update(max(m1, m2), 10)
    assert 0.0 <= worse.weight <= better.weight <= 1.0


def test_unseen_node_has_the_prior() -> None:
    assert Credibility(prior=0.5).weight == 0.5
    assert Credibility(prior=0.3).update(0.1, 0).weight == 0.3


def test_converges_to_accuracy_and_forgets_with_half_life() -> None:
    c = Credibility(prior=0.5, half_life=2.0, n0=20.0)
    for _ in range(200):
        c.update(0.05, 100)
    assert c.weight == pytest.approx(0.95, abs=1e-3)
    c.update(0.45, 100).update(0.45, 100)  # two windows = one half-life: EWMA half way to 0.45
    assert c.ewma_mape == pytest.approx(0.25, abs=1e-9)
    c.update(3.0, 10)  # worse than 100 % error pulls accuracy toward 0, never below
    assert 0.0 <= c.accuracy < 0.5


def test_state_round_trip_and_validation() -> None:
    c = Credibility().update(0.2, 7)
    d = Credibility().load(c.to_dict())
    assert (d.weight, d.n) == (c.weight, 7)
    with pytest.raises(ValueError):
        Credibility().load({"ewma_mape": -1.0, "n": 1})
    for bad in ({"prior": -0.1}, {"half_life": 0.0}, {"n0": -1.0}):
        with pytest.raises(ValueError):
            Credibility(**bad)
