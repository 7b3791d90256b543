"""One retrain as a blocking function: holdout split, feature choice, a challenger that learns the signal."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.model.errors import NotEnoughSamplesError
from app.trainer.history import Dataset
from app.trainer.pipeline import SELECTION_MAX_ROWS, choose_features, emphasise_after, score, split, train_challenger

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

    fit, _ = split(dataset(700))  # 560 fit rows: enough for metric columns (METRIC_MIN_ROWS)
    assert choose_features(fit, pick_util) == ("nvidia_smi_utilization_gpu__mean", "hw_gpu_mem_bw_gbs")
    everything = ("nvidia_smi_utilization_gpu__mean", "nvidia_smi_memory_used__mean", "junk__std",
                  "hw_gpu_mem_bw_gbs")
    assert choose_features(fit, lambda X, y, n: []) == ("hw_gpu_mem_bw_gbs",)  # nothing chosen: no metric column
    assert choose_features(fit, lambda X, y, n: [], fallback="all") == everything
    assert choose_features(fit, None) == everything


def test_too_few_rows_for_metrics_train_on_hardware_and_task_columns_only() -> None:
    """Below ``metric_min_rows`` fit rows no metric column is a candidate, whatever the selector says."""
    calls = []

    def everything(X: np.ndarray, y: np.ndarray, names: Sequence[str]) -> Sequence[str]:
        calls.append(len(names))
        return list(names)

    fit, _ = split(dataset(600))  # 480 fit rows
    assert choose_features(fit, everything, metric_min_rows=481) == ("hw_gpu_mem_bw_gbs",) and not calls
    assert len(choose_features(fit, everything, metric_min_rows=480)) == 4 and calls == [3]
    ch = train_challenger(dataset(300), "gpu", params=FAST)  # 240 fit rows: under the default
    assert ch.selected == ("hw_gpu_mem_bw_gbs",)


def test_challenger_learns_the_signal_with_real_selection() -> None:
    ch = train_challenger(dataset(400), "gpu", params=FAST, metric_min_rows=300)
    assert "nvidia_smi_utilization_gpu__mean" in ch.selected
    assert "junk__std" not in ch.selected
    assert ch.n_fit == 320 and len(ch.holdout) == 80
    assert ch.metrics["mape"] < 0.1
    assert ch.result.feature_names == ch.selected


def test_noise_labels_give_a_poor_challenger() -> None:
    good = train_challenger(dataset(400), "gpu", params=FAST, selector=None, metric_min_rows=0)
    bad = train_challenger(dataset(400, noise=True), "gpu", params=FAST, selector=None, metric_min_rows=0)
    assert bad.metrics["rmse_ms"] > 3 * good.metrics["rmse_ms"]


def test_score_handles_missing_columns_and_too_few_rows() -> None:
    _, hold = split(dataset(100))
    m = score(lambda X: np.where(np.isnan(X[:, 0]), 0.0, X[:, 0]), ["not_there"], hold)
    assert m["n"] == len(hold) and m["mape"] == pytest.approx(1.0)
    with pytest.raises(NotEnoughSamplesError):
        train_challenger(dataset(20), "gpu", params=FAST)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 400), fraction=st.floats(0.05, 0.5), onset=st.one_of(st.none(), st.floats(-5.0, 405.0)))
def test_split_partitions_the_rows_in_time_order(n: int, fraction: float, onset: float | None) -> None:
    ds = dataset(n)
    fit, hold = split(ds, fraction, onset)
    after = int((ds.ts >= onset).sum()) if onset is not None else 0
    assert len(hold) in (max(1, math.ceil(n * fraction)), 2 * (after // 2)) and len(fit) + len(hold) == n
    assert sorted(fit.ts.tolist() + hold.ts.tolist()) == ds.ts.tolist()  # every row once
    assert np.all(np.diff(fit.ts) > 0) and np.all(np.diff(hold.ts) > 0)


def test_after_a_drift_the_rows_since_the_onset_are_shared_by_fit_and_holdout() -> None:
    ds = dataset(1000)
    fit, hold = split(ds, 0.2, onset_ts=960.0)  # 40 rows since the onset, far fewer than the 200 held out
    after_fit, after_hold = fit.ts[fit.ts >= 960.0], hold.ts[hold.ts >= 960.0]
    assert (after_fit.size, after_hold.size) == (20, 20)
    assert hold.ts[hold.ts < 960.0].tolist() == list(range(940, 960))  # as many of the newest rows before
    assert fit.ts[fit.ts < 960.0].max() == 939.0
    # too few rows since the onset, an onset in the future, or one far back: the newest rows are held out
    for onset in (995.0, 2000.0, 100.0):
        assert split(ds, 0.2, onset)[1].ts.tolist() == list(range(800, 1000))


def test_a_challenger_trained_after_a_drift_learns_the_new_regime() -> None:
    ds = dataset(2000)
    y = ds.y.copy()
    y[1900:] *= 2.0  # the RTT doubled for the last 100 tasks; util, memory etc. do not show it ...
    X = ds.X.copy()
    X[1900:, 2] = 5.0  # ... except one column, constant before: the newest regime is learnable
    drifted = Dataset(X, y, ds.ts, ds.names)
    quick = {"n_estimators": 40, "learning_rate": 0.3}
    blind = train_challenger(drifted, "gpu", params=quick, selector=None)
    aware = train_challenger(drifted, "gpu", params=quick, selector=None, onset_ts=1900.0)
    new_rows = aware.holdout.ts >= 1900.0
    assert new_rows.sum() == 50 and len(aware.holdout) == 100 and (blind.holdout.ts >= 1900.0).sum() == 100
    predicted = aware.result.booster.inplace_predict(aware.holdout.columns(aware.selected))[new_rows]
    assert np.mean(np.abs(predicted - aware.holdout.y[new_rows]) / aware.holdout.y[new_rows]) < 0.1
    old = blind.result.booster.inplace_predict(drifted.columns(blind.selected))[1900:]
    assert np.mean(np.abs(old - y[1900:]) / y[1900:]) > 0.4  # without the onset no drifted row was learnt


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), onset=st.floats(-5.0, 305.0), copies=st.integers(1, 30))
def test_rows_since_the_onset_are_repeated_but_never_outweigh_the_rest(n: int, onset: float, copies: int) -> None:
    ds = dataset(n)
    out = emphasise_after(ds, onset, copies)
    before, after = int((ds.ts < onset).sum()), int((ds.ts >= onset).sum())
    repeated = len(out) - before
    assert out.ts[:before].tolist() == ds.ts[:before].tolist()  # the rows before, once each, first
    assert repeated % max(after, 1) == 0 and after <= repeated <= max(after, before, after * copies)
    assert repeated == after or repeated <= before


@pytest.fixture(scope="module")
def constrained():
    """A GPU-app challenger trained on noisy samples, under the monotone constraints."""
    rng = np.random.default_rng(3)
    n = 400
    pods = rng.integers(0, 4, size=(n, 3)).astype(np.float32)
    mb = rng.uniform(10, 300, n)
    tflops = rng.choice([3.5, 82.6], n)
    iowait = rng.uniform(0, 0.5, n)
    y = (5.0 + mb * 3.0 / tflops) * (1.0 + 0.5 * pods[:, 1]) * rng.lognormal(0, 0.3, n)
    names = ("running_pods_Motioncor2", "running_pods_gCTF", "running_pods_upload", "task_input_size_mb",
             "hw_gpu_fp32_tflops", "cpu_iowait__mean")
    X = np.column_stack([pods, mb, tflops, iowait]).astype(np.float32)
    ds = Dataset(X, y, np.arange(n, dtype=np.float64), names)
    return train_challenger(ds, "gpu", params={"n_estimators": 40, "objective": "reg:gamma"}, selector=None,
                            gpu_app=True)


@settings(max_examples=60, deadline=None)
@given(pods=st.integers(0, 3), more=st.integers(1, 3), mb=st.floats(10, 300), fast=st.booleans(),
       iowait=st.floats(0, 0.5), feature=st.sampled_from(["running_pods_gCTF", "running_pods_upload",
                                                          "task_input_size_mb", "cpu_iowait__mean"]))
def test_more_load_never_predicts_faster(constrained, pods, more, mb, fast, iowait, feature) -> None:
    names = constrained.result.feature_names
    base = {"running_pods_Motioncor2": pods, "running_pods_gCTF": pods, "running_pods_upload": pods,
            "task_input_size_mb": mb, "hw_gpu_fp32_tflops": 82.6 if fast else 3.5, "cpu_iowait__mean": iowait}
    bigger = {**base, feature: base[feature] + more * (10.0 if feature == "task_input_size_mb" else 1.0)}
    X = np.array([[r.get(n, np.nan) for n in names] for r in (base, bigger)], dtype=np.float32)
    lo, hi = constrained.result.booster.inplace_predict(X)
    assert hi >= lo * (1 - 1e-6)
    faster = np.array([[{**base, "hw_gpu_fp32_tflops": 82.6}.get(n, np.nan) for n in names]], dtype=np.float32)
    slower = np.array([[{**base, "hw_gpu_fp32_tflops": 3.5}.get(n, np.nan) for n in names]], dtype=np.float32)
    predict = constrained.result.booster.inplace_predict
    assert predict(faster)[0] <= predict(slower)[0] * (1 + 1e-6)


def test_an_unknown_fallback_is_refused() -> None:
    fit, _ = split(dataset(200))
    with pytest.raises(ValueError, match="fallback"):
        choose_features(fit, None, fallback="some")


def test_the_vote_sees_the_newest_fit_rows_only() -> None:
    """The selector gets the newest ``SELECTION_MAX_ROWS`` fit rows (MIC's cost grows about as n^1.8)."""
    seen: list[np.ndarray] = []

    def record(X: np.ndarray, y: np.ndarray, names: Sequence[str]) -> Sequence[str]:
        seen.append(np.asarray(y))
        return []

    fit, _ = split(dataset(SELECTION_MAX_ROWS * 2))
    assert len(fit) > SELECTION_MAX_ROWS
    choose_features(fit, record)
    assert len(seen) == 1 and seen[0].size == SELECTION_MAX_ROWS
    assert np.array_equal(seen[0], fit.y[-SELECTION_MAX_ROWS:])
    seen.clear()
    choose_features(fit, record, max_rows=len(fit))
    assert seen[0].size == len(fit)
