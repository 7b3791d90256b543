"""Residual correction at its edges: saved state that comes back as it left, sub-millisecond and zero RTTs,
and a published correction below 1 undone as well as one above."""

from __future__ import annotations

import math

import pytest

from app.drift.residual import Residual, model_prediction


def test_a_fresh_or_reset_residual_survives_a_save_and_load() -> None:
    """A worker that restarts before an app's first task (or right after a new model) must load its own state."""
    fresh = Residual().load(Residual().to_dict())
    assert (fresh.factor, fresh.n) == (1.0, 0)
    used = Residual().update(100.0, 200.0).update(100.0, 200.0)
    used.reset()
    assert used.n == 0
    again = Residual().load(used.to_dict())
    assert (again.factor, again.n) == (1.0, 0)


def test_state_without_fields_loads_as_a_fresh_residual() -> None:
    r = Residual().load({})
    assert (r.factor, r.n) == (1.0, 0)


@pytest.mark.parametrize("state", [{"bias": math.inf, "n": 3}, {"bias": math.nan, "n": 3}, {"bias": 0.1, "n": -1}])
def test_a_corrupt_state_is_refused(state: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="bad residual state"):
        Residual().load(state)


def test_every_usable_task_counts() -> None:
    r = Residual()
    for _ in range(5):
        r.update(100.0, 120.0)
    assert r.n == 5
    assert Residual().load(r.to_dict()).n == 5


def test_sub_millisecond_rtts_are_learned_like_any_other() -> None:
    """"Two finite positive numbers": a 0.4 ms prediction of a 0.8 ms task is a factor 2 error like 400 vs 800."""
    small, large = Residual(alpha=0.5), Residual(alpha=0.5)
    small.update(0.4, 0.8)
    large.update(400.0, 800.0)
    assert small.n == 1 and small.factor == pytest.approx(large.factor)
    slow = Residual(alpha=0.5).update(100.0, 0.5)  # an observed RTT below 1 ms moves the factor too
    assert slow.n == 1 and slow.factor < 1.0


def test_an_observed_rtt_of_zero_is_ignored_not_an_error() -> None:
    r = Residual().update(100.0, 0.0)
    assert (r.factor, r.n) == (1.0, 0)


def test_a_correction_below_one_is_undone_too() -> None:
    """The extender published 0.5 × the model's 600 ms: the model itself said 600."""
    assert model_prediction(300.0, 0.5) == pytest.approx(600.0)
    assert model_prediction(300.0, 1.0) == 300.0
