"""Learning side of the RTT-aware policy: the residual correction (bounded, converging, reset per app) and
the metric features a model trains on."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.sim.policies.feedback import Residuals

ratios = st.floats(min_value=1e-3, max_value=1e3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(ratios, st.floats(min_value=1.0, max_value=1e4)), min_size=1, max_size=50),
       st.floats(min_value=0.01, max_value=1.0), st.floats(min_value=0.05, max_value=2.0))
def test_factor_stays_within_the_clip(errors, alpha, clip):
    r = Residuals(alpha=alpha, clip=clip)
    for ratio, predicted in errors:
        r.update("n", "gCTF", predicted, predicted * ratio)
        assert math.exp(-clip) - 1e-12 <= r.factor("n", "gCTF") <= math.exp(clip) + 1e-12


@given(st.floats(min_value=0.6, max_value=1.6), st.floats(min_value=0.05, max_value=1.0))
def test_a_steady_error_is_learned(ratio, alpha):
    r = Residuals(alpha=alpha)
    for _ in range(400):
        r.update("n", "gCTF", 100.0, 100.0 * ratio)
    assert r.factor("n", "gCTF") == pytest.approx(ratio, rel=1e-3)
    assert r.factor("n", "Motioncor2") == 1.0 and r.factor("m", "gCTF") == 1.0


def test_ignores_missing_predictions_and_resets_per_app():
    r = Residuals(alpha=0.5)
    r.update("n", "gCTF", math.nan, 100.0)
    r.update("n", "gCTF", 0.0, 100.0)
    assert r.factor("n", "gCTF") == 1.0
    r.update("n", "gCTF", 100.0, 150.0)
    r.update("n", "upload", 100.0, 50.0)
    r.reset("gCTF")
    assert r.factor("n", "gCTF") == 1.0 and r.factor("n", "upload") < 1.0


@pytest.mark.parametrize("kw", [{"alpha": 0.0}, {"alpha": 1.5}, {"clip": 0.0}])
def test_rejects_bad_settings(kw):
    with pytest.raises(ValueError, match="alpha|clip"):
        Residuals(**kw)


def test_model_uses_only_the_selected_metric_features():
    """Metric features a model trains on are the ones selection chose - none when it chose none."""
    import numpy as np

    from app.sim.policies.learner import ModelBook, always_kept

    rng = np.random.default_rng(3)
    book = ModelBook(seed=1, train_params={"n_estimators": 10})
    for _ in range(150):
        mb = float(rng.uniform(10, 200))
        noise = {f"m{j}__mean": float(rng.normal()) for j in range(6)}
        book.add("gCTF:gpu", {"task_input_size_mb": mb, **noise}, 5.0 + 0.4 * mb * float(rng.lognormal(0, 0.01)))
    trained = book.train("gCTF:gpu", "gpu", 0.0)
    assert trained is not None
    metric = {f for f in trained.features if not always_kept(f)}
    assert metric <= set(book.selections["gCTF:gpu"])
    assert "task_input_size_mb" in trained.features
