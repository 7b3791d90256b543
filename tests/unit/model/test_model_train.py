from __future__ import annotations

import json

import numpy as np
import pytest
import xgboost
from model_samples import synthetic_rtt

from app.errors import RttError
from app.model.errors import ModelFormatError, NotEnoughSamplesError, TrainingError
from app.model.train import MIN_SAMPLES, booster_from_bytes, booster_to_bytes, evaluate, train_model

NAMES = [f"m{i}__mean" for i in range(6)]
FAST = {"n_estimators": 15, "max_depth": 4, "max_bin": 64, "nthread": 1}


def test_trains_on_the_past_and_scores_on_the_most_recent_rows(rtt_data):
    X, y = rtt_data
    res = train_model(X, y, NAMES, "cpu", holdout_fraction=0.25, params=FAST)
    assert res.metrics["n_holdout"] == 150
    assert res.metrics["n_train"] == 450
    assert res.feature_names == tuple(NAMES)
    assert res.booster.num_boosted_rounds() == 15
    assert res.params["max_depth"] == 4 and res.params["learning_rate"] == 0.1, "overrides merge over the preset"
    # the metrics are those of the last 150 rows, recomputed independently
    pred = res.booster.inplace_predict(X[450:])
    assert res.metrics["mae_ms"] == pytest.approx(float(np.mean(np.abs(pred - y[450:]))), rel=1e-6)
    assert res.metrics["accuracy"] == pytest.approx(1 - res.metrics["mape"])
    assert res.metrics["accuracy"] > 0.7, "a learnable signal is learnt"
    assert set(res.metrics) == {"rmse_ms", "mae_ms", "mape", "accuracy", "n_train", "n_holdout"}


def test_balancing_caps_the_training_rows(rtt_data):
    X, y = rtt_data
    res = train_model(X, y, NAMES, "gpu", max_samples=100, params=FAST)
    assert res.metrics["n_train"] == 100
    assert res.metrics["n_holdout"] == 120


def test_same_seed_same_model(rtt_data):
    X, y = rtt_data
    a = train_model(X, y, NAMES, "gpu", seed=3, params={**FAST, "device": "cpu"})
    b = train_model(X, y, NAMES, "gpu", seed=3, params={**FAST, "device": "cpu"})
    assert booster_to_bytes(a.booster) == booster_to_bytes(b.booster)


def test_rows_without_rtt_are_dropped_and_too_few_rows_refused():
    X, y = synthetic_rtt(MIN_SAMPLES + 5)
    y[:10] = np.nan
    with pytest.raises(NotEnoughSamplesError) as err:
        train_model(X, y, NAMES, "cpu", params=FAST)
    assert err.value.n == 15
    assert isinstance(err.value, RttError)


def test_too_few_rows_left_after_the_holdout_names_the_rows_left():
    X, y = synthetic_rtt(MIN_SAMPLES)
    with pytest.raises(NotEnoughSamplesError, match="2 samples left after holding out 18, at least 10") as err:
        train_model(X, y, NAMES, "cpu", holdout_fraction=0.9, params=FAST)
    assert (err.value.n, err.value.needed) == (2, MIN_SAMPLES // 2)


@pytest.mark.parametrize(
    ("X", "y", "names", "match"),
    [
        (np.zeros((30, 6)), np.zeros(29), NAMES, "one value per row"),
        (np.zeros(30), np.zeros(30), NAMES, "2-D"),
        (np.zeros((30, 5)), np.zeros(30), NAMES, "6 feature names for 5 columns"),
        (np.zeros((30, 2)), np.zeros(30), ["a", "a"], "unique"),
    ],
)
def test_bad_shapes_are_refused(X, y, names, match):
    with pytest.raises(TrainingError, match=match):
        train_model(X, y, names, "cpu", params=FAST)


def test_bad_arguments_are_refused(rtt_data):
    X, y = rtt_data
    with pytest.raises(TrainingError, match="holdout_fraction"):
        train_model(X, y, NAMES, "cpu", holdout_fraction=0.95)
    with pytest.raises(TrainingError, match="max_samples"):
        train_model(X, y, NAMES, "cpu", max_samples=5)
    with pytest.raises(ValueError, match="node_class"):
        train_model(X, y, NAMES, "fpga")


def test_no_holdout_scores_the_training_rows(rtt_data):
    X, y = rtt_data
    res = train_model(X, y, NAMES, "cpu", holdout_fraction=0.0, params=FAST)
    assert res.metrics["n_holdout"] == 0
    assert np.isfinite(res.metrics["rmse_ms"])


def test_evaluate_known_values_and_empty_input():
    m = evaluate(lambda X: X[:, 0], np.array([[110.0], [90.0], [200.0]]), np.array([100.0, 100.0, 200.0]))
    assert m["mae_ms"] == pytest.approx(20 / 3)
    assert m["rmse_ms"] == pytest.approx(np.sqrt(200 / 3))
    assert m["mape"] == pytest.approx(0.2 / 3)
    assert m["n"] == 3
    bad = evaluate(lambda X: X[:, 0] * 10, np.array([[100.0]]), np.array([1.0]))
    assert bad["accuracy"] == 0.0, "accuracy is clipped at 0"
    assert np.isnan(evaluate(lambda X: X, np.zeros((0, 1)), np.zeros(0))["rmse_ms"])


@pytest.mark.parametrize("fmt", ["ubj", "json"])
def test_bytes_round_trip_keeps_predictions_and_names(small_booster, fmt, rtt_data):
    raw = booster_to_bytes(small_booster, fmt)
    if fmt == "json":
        assert json.loads(raw)["learner"]["feature_names"] == small_booster.feature_names
    else:
        assert not raw.startswith(b"{\"")
    back = booster_from_bytes(raw)
    X, _ = rtt_data
    assert np.array_equal(back.inplace_predict(X), small_booster.inplace_predict(X))
    assert back.feature_names == small_booster.feature_names


def test_bytes_never_pickle_and_garbage_is_refused(small_booster):
    with pytest.raises(ValueError, match="fmt"):
        booster_to_bytes(small_booster, "pickle")
    with pytest.raises(ModelFormatError):
        booster_from_bytes(b"\x80\x04not a model")
    with pytest.raises(ModelFormatError):
        booster_from_bytes(b"")
    assert isinstance(booster_from_bytes(booster_to_bytes(small_booster)), xgboost.Booster)
