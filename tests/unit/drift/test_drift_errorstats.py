"""Windowed error statistics equal a numpy batch recomputation, merge exactly and round-trip."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.drift.errorstats import MIN_PCT_ACTUAL_MS, ErrorStats

ms = st.floats(min_value=0.0, max_value=1e6)
pairs = st.lists(st.tuples(ms, ms), max_size=40)


def batch(p: list[tuple[float, float]]) -> dict[str, float]:
    if not p:
        return {"n": 0, "rmse_ms": 0.0, "mae_ms": 0.0, "mape": 0.0, "bias_ms": 0.0}
    pred, act = np.array(p).T
    e = pred - act
    pos = act >= MIN_PCT_ACTUAL_MS
    return {"n": len(p), "rmse_ms": float(np.sqrt(np.mean(e ** 2))), "mae_ms": float(np.mean(np.abs(e))),
            "mape": float(np.mean(np.abs(e[pos]) / act[pos])) if pos.any() else 0.0, "bias_ms": float(np.mean(e))}


def figures(s: ErrorStats) -> dict[str, float]:
    return {"n": s.n, "rmse_ms": s.rmse_ms, "mae_ms": s.mae_ms, "mape": s.mape, "bias_ms": s.bias_ms}


def close(a: dict[str, float], b: dict[str, float]) -> None:
    assert a["n"] == b["n"]
    for k in ("rmse_ms", "mae_ms", "mape", "bias_ms"):
        assert a[k] == pytest.approx(b[k], rel=1e-9, abs=1e-6), k


def of(p: list[tuple[float, float]]) -> ErrorStats:
    s = ErrorStats()
    for pred, act in p:
        s.update(pred, act)
    return s


@given(pairs)
def test_incremental_equals_batch(p: list[tuple[float, float]]) -> None:
    close(figures(of(p)), batch(p))


@given(pairs, pairs)
def test_merge_equals_union(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> None:
    left, right = of(a), of(b)
    before = left.to_dict()
    close(figures(left + right), batch(a + b))
    assert left.to_dict() == before  # merge does not mutate


@given(pairs)
def test_update_many_equals_update(p: list[tuple[float, float]]) -> None:
    pred = [x for x, _ in p]
    act = [y for _, y in p]
    close(figures(ErrorStats().update_many(pred, act)), figures(of(p)))


@given(pairs)
def test_dict_round_trip(p: list[tuple[float, float]]) -> None:
    s = of(p)
    assert ErrorStats.from_dict(s.to_dict()) == s


def test_non_finite_pairs_and_zero_actuals() -> None:
    s = ErrorStats().update(math.nan, 10.0).update(10.0, math.inf).update(5.0, 0.0).update(12.0, 10.0)
    assert s.n == 2 and s.n_pct == 1
    assert s.mape == pytest.approx(0.2)
    assert s.bias_ms == pytest.approx(3.5)
    assert s.relative_rmse == pytest.approx(s.rmse_ms / 5.0)
    assert ErrorStats().summary() == {"n": 0, "rmse_ms": 0.0, "mae_ms": 0.0, "mape": 0.0, "bias_ms": 0.0}


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError):
        ErrorStats.from_dict({"n": 1, "bogus": 2})
    with pytest.raises(ValueError):
        ErrorStats.from_dict({"n": 1, "n_pct": 2})
    with pytest.raises(ValueError):
        ErrorStats().update_many([1.0, 2.0], [1.0])
