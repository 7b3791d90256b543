"""Residual correction: bounded, converging to a steady error, reset by a new model, carried by the tracker."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.drift.residual import Residual, model_prediction
from app.drift.tracker import NodeTracker

ratios = st.floats(min_value=1e-3, max_value=1e3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(ratios, st.floats(min_value=1.0, max_value=1e4)), min_size=1, max_size=50),
       st.floats(min_value=0.01, max_value=1.0), st.floats(min_value=0.05, max_value=4.0))
def test_factor_stays_within_the_clip(errors, alpha, clip):
    r = Residual(alpha=alpha, clip=clip)
    for ratio, predicted in errors:
        r.update(predicted, predicted * ratio)
        assert math.exp(-clip) - 1e-12 <= r.factor <= math.exp(clip) + 1e-12


@given(st.floats(min_value=0.05, max_value=15.0), st.floats(min_value=0.05, max_value=1.0))
def test_a_steady_error_is_learned_without_a_x2_cap(ratio, alpha):
    r = Residual(alpha=alpha)
    for _ in range(400):
        r.update(100.0, 100.0 * ratio)
    assert r.factor == pytest.approx(ratio, rel=1e-3)


def test_a_slowdown_to_30_percent_speed_is_followed_within_ten_tasks():
    r = Residual()
    for _ in range(10):
        r.update(100.0, 333.0)
    assert r.factor > 2.9  # the default step learns 97 % of the log error in 10 tasks


def test_ignores_unusable_pairs_and_resets():
    r = Residual(alpha=0.5)
    for bad in [(math.nan, 100.0), (0.0, 100.0), (100.0, -1.0), (math.inf, 5.0)]:
        r.update(*bad)
    assert r.factor == 1.0 and r.n == 0
    r.update(100.0, 150.0)
    assert r.factor > 1.0 and r.n == 1
    assert r.reset().factor == 1.0


@pytest.mark.parametrize("kw", [{"alpha": 0.0}, {"alpha": 1.5}, {"clip": 0.0}, {"alpha": math.nan}])
def test_rejects_bad_settings(kw):
    with pytest.raises(ValueError, match="alpha|clip"):
        Residual(**kw)


def test_model_prediction_undoes_a_published_correction():
    assert model_prediction(300.0, 1.5) == pytest.approx(200.0)
    assert model_prediction(300.0, None) == 300.0 and model_prediction(300.0, 0.0) == 300.0


def test_tracker_learns_from_the_model_prediction_not_the_corrected_one():
    """The worker sees the corrected prediction; the residual must converge on model vs actual anyway."""
    t = NodeTracker()
    model = 100.0
    for _ in range(60):
        corrected = model * t.correction("gCTF")
        t.add("gCTF", corrected, 250.0, model_ms=model)
    assert t.correction("gCTF") == pytest.approx(2.5, rel=1e-3)
    assert t.correction("upload") == 1.0


def test_a_new_model_resets_the_app_only_and_stale_pairs_can_be_left_out():
    t = NodeTracker()
    t.add("gCTF", 100.0, 200.0)
    t.add("upload", 100.0, 50.0)
    t.new_model("gCTF")
    assert t.correction("gCTF") == 1.0 and t.correction("upload") < 1.0
    t.add("gCTF", 100.0, 400.0, residual=False)  # made by the previous model
    assert t.correction("gCTF") == 1.0
    assert "gCTF" not in t.weights_fields()["correction"]


def test_residuals_and_samples_survive_a_restart():
    a = NodeTracker()
    for k in range(7):
        a.add("gCTF", 100.0, 180.0 + k)
        a.count_sample("gCTF")
    b = NodeTracker().load(orjson.loads(orjson.dumps(a.to_dict())))
    assert b.weights_fields() == a.weights_fields()
    assert b.samples("gCTF") == 7
    a.add("gCTF", 100.0, 300.0)
    b.add("gCTF", 100.0, 300.0)
    assert a.correction("gCTF") == b.correction("gCTF")
