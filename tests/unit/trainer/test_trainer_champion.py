"""Champion/challenger decision: the margin, the unusable cases, and a Hypothesis check of the rule."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.trainer.champion import judge

rmse = st.floats(min_value=0.0, max_value=1e6)


@pytest.mark.parametrize(("new", "old", "promote", "reason"), [
    (97.9, 100.0, True, "better"),
    (98.0, 100.0, False, "not_better"),     # exactly the margin is not enough
    (150.0, 100.0, False, "not_better"),
    (10.0, None, True, "no_champion"),
    (10.0, math.nan, True, "champion_unusable"),
    (math.nan, 100.0, False, "challenger_unusable"),
    (math.inf, None, False, "challenger_unusable"),
])
def test_rule(new: float, old: float | None, promote: bool, reason: str) -> None:
    v = judge({"rmse_ms": new}, None if old is None else {"rmse_ms": old})
    assert (v.promote, v.reason) == (promote, reason)


@given(rmse, rmse, st.floats(min_value=0.0, max_value=0.5))
def test_promotes_exactly_when_better_by_margin(new: float, old: float, margin: float) -> None:
    v = judge({"rmse_ms": new}, {"rmse_ms": old}, margin=margin)
    assert v.promote == (new < (1 - margin) * old)


def test_bad_margin_raises() -> None:
    with pytest.raises(ValueError):
        judge({"rmse_ms": 1.0}, None, margin=1.0)
