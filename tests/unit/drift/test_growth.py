"""SampleGrowth: cold start once (again only when the count doubles), then geometric growth retrains."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.drift.growth import COLD_START, GROWTH, SampleGrowth


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
