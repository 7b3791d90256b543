"""One retrain as a blocking function: holdout split, feature choice, a challenger that learns the signal."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from app.model.errors import NotEnoughSamplesError
from app.trainer.history import Dataset
from app.trainer.pipeline import choose_features, score, split, train_challenger

FAST = {"n_estimators": 30}


def dataset(n: int, seed: int = 0, noise: bool = False) -> Dataset:
    rng = np.random.default_rng(seed)
    util = rng.uniform(0, 100, n)
    mem = rng.uniform(0, 8000, n)
    junk = rng.normal(size=n)
    y = 200.0 + 5.0 * util + 0.05 * mem
    if noise:
        y = rng.uniform(50.0, 1500.0, n)
    X = np.column_stack([util, mem, junk, np.full(n, 1008.0), np.full(n, np.nan)]).astype(np.float32)
    names = ("nvidia_smi_utilization_gpu__mean", "nvidia_smi_memory_used__mean", "junk__std",
             "hw_gpu_mem_bw_gbs", "hw_cpu_cores")
    return Dataset(X, y, np.arange(n, dtype=np.float64), names)


def test_split_keeps_the_most_recent_rows_for_holdout() -> None:
    fit, hold = split(dataset(101), 0.2)
    assert (len(fit), len(hold)) == (80, 21)
    assert fit.ts.max() < hold.ts.min()
    with pytest.raises(ValueError):
        split(dataset(10), 1.0)


def test_choose_features_keeps_the_selector_choice_and_hardware() -> None:
    def pick_util(X: np.ndarray, y: np.ndarray, names: Sequence[str]) -> Sequence[str]:
        assert "hw_gpu_mem_bw_gbs" not in names and X.shape[1] == len(names)
        return ["nvidia_smi_utilization_gpu__mean"]

    fit, _ = split(dataset(200))
    assert choose_features(fit, pick_util) == ("nvidia_smi_utilization_gpu__mean", "hw_gpu_mem_bw_gbs")
    everything = ("nvidia_smi_utilization_gpu__mean", "nvidia_smi_memory_used__mean", "junk__std",
                  "hw_gpu_mem_bw_gbs")
    assert choose_features(fit, lambda X, y, n: []) == everything  # nothing chosen: all varying columns
    assert choose_features(fit, None) == everything


def test_challenger_learns_the_signal_with_real_selection() -> None:
    ch = train_challenger(dataset(400), "gpu", params=FAST)
    assert "nvidia_smi_utilization_gpu__mean" in ch.selected
    assert "junk__std" not in ch.selected
    assert ch.n_fit == 320 and len(ch.holdout) == 80
    assert ch.metrics["mape"] < 0.1
    assert ch.result.feature_names == ch.selected


def test_noise_labels_give_a_poor_challenger() -> None:
    good = train_challenger(dataset(400), "gpu", params=FAST, selector=None)
    bad = train_challenger(dataset(400, noise=True), "gpu", params=FAST, selector=None)
    assert bad.metrics["rmse_ms"] > 3 * good.metrics["rmse_ms"]


def test_score_handles_missing_columns_and_too_few_rows() -> None:
    _, hold = split(dataset(100))
    m = score(lambda X: np.where(np.isnan(X[:, 0]), 0.0, X[:, 0]), ["not_there"], hold)
    assert m["n"] == len(hold) and m["mape"] == pytest.approx(1.0)
    with pytest.raises(NotEnoughSamplesError):
        train_challenger(dataset(20), "gpu", params=FAST)
