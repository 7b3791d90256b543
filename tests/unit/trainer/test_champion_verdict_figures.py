"""Every verdict carries both holdout figures as given (the trainer logs them and the history records them), and a
margin out of range is refused naming its value."""

from __future__ import annotations

import math

import pytest

from app.trainer.champion import judge


@pytest.mark.parametrize(("new", "old", "reason"), [
    (math.inf, 100.0, "challenger_unusable"),
    (10.0, math.inf, "champion_unusable"),
    (120.0, 100.0, "not_better"),
    (90.0, 100.0, "better"),
])
def test_a_verdict_reports_the_two_figures_it_compared(new: float, old: float, reason: str) -> None:
    v = judge({"rmse_ms": new}, {"rmse_ms": old})
    assert (v.reason, v.challenger_rmse_ms, v.champion_rmse_ms) == (reason, new, old)


def test_a_margin_out_of_range_is_named_in_the_error() -> None:
    with pytest.raises(ValueError, match=r"^margin must be in \[0, 1\) \(got 1.5\)$"):
        judge({"rmse_ms": 1.0}, None, margin=1.5)
