"""Train one RTT model: time-ordered holdout, balanced training set, XGBoost preset, holdout metrics.

:func:`train_model` is a pure, blocking function: callers on an event loop run it in a thread or a
process. Rows are in time order, so the holdout is the most recent ``holdout_fraction`` of them — the
metrics say how the model does on data newer than anything it saw. NaN in ``X`` means missing.

Models travel as XGBoost's own formats (UBJ or JSON via ``save_raw``), never pickle.

Threads: XGBoost's OpenMP threads wait for each other at every step of every tree. When they share
their cores with other busy processes (the worker and the extender on a small host), each barrier
waits for a descheduled thread: 150 rounds that take 0.4 s on two idle cores took 8–13 s beside
another OpenMP process, against ~1 s with one thread. So unless ``params`` says otherwise, training
uses :func:`default_nthread` threads: every CPU the process is pinned to (``RTT_TRAINER_CPUS``), or,
unpinned, every CPU of the machine but one.

>>> m = evaluate(lambda X: X[:, 0] * 1.1, np.array([[100.0], [200.0]]), np.array([100.0, 200.0]))
>>> round(m["mape"], 3), round(m["accuracy"], 3), round(m["mae_ms"], 1), m["n"]
(0.1, 0.9, 15.0, 2.0)
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import xgboost

from app.contracts.codec import shown_name
from app.contracts.names import xgboost_refuses
from app.cpus import usable_cpus
from app.model.balance import stratified_sample
from app.model.errors import ModelFormatError, NotEnoughSamplesError, TrainingError
from app.model.presets import xgb_params

log = logging.getLogger(__name__)

MIN_SAMPLES = 20
FORMATS = ("ubj", "json")
POSITIVE_OBJECTIVES = frozenset({"reg:gamma", "reg:tweedie", "count:poisson"})  # log link: label must be > 0
MAPE_FLOOR_MS = 1e-3  # an RTT of 0 ms must not divide by zero


@dataclasses.dataclass(frozen=True, eq=False)
class TrainResult:
    """A trained booster with what it needs to be used and judged.

    ``metrics``: ``rmse_ms``, ``mae_ms``, ``mape``, ``accuracy`` (``max(0, 1 - mape)``) on the holdout,
    plus ``n_train`` (rows trained on, after balancing) and ``n_holdout``.
    """

    booster: xgboost.Booster
    feature_names: tuple[str, ...]
    params: dict[str, Any]
    metrics: dict[str, float]


def evaluate(predict: Callable[[np.ndarray], np.ndarray], X: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Error of ``predict`` on ``(X, y)``: ``rmse_ms``, ``mae_ms``, ``mape``, ``accuracy``, ``n``.

    ``mape`` is a fraction (0.1 = 10 %); ``accuracy`` is ``1 - mape`` clipped to ``[0, 1]``. With no rows
    every error is NaN and ``n`` is 0.
    """
    y = np.asarray(y, dtype=np.float64)
    if y.size == 0:
        nan = math.nan
        return {"rmse_ms": nan, "mae_ms": nan, "mape": nan, "accuracy": nan, "n": 0.0}
    pred = np.asarray(predict(X), dtype=np.float64).reshape(-1)
    if pred.shape != y.shape:
        raise TrainingError(f"predict returned {pred.shape[0]} values for {y.shape[0]} rows")
    err = pred - y
    mape = float(np.mean(np.abs(err) / np.maximum(np.abs(y), MAPE_FLOOR_MS)))
    return {
        "rmse_ms": float(np.sqrt(np.mean(err * err))),
        "mae_ms": float(np.mean(np.abs(err))),
        "mape": mape,
        "accuracy": float(min(1.0, max(0.0, 1.0 - mape))),
        "n": float(y.size),
    }


def default_nthread() -> int:
    """XGBoost threads: the CPUs this process may use (its affinity, at most its container's CPU quota:
    :func:`app.cpus.usable_cpus`), less one when that is every CPU of the machine (at least 1).

    >>> 1 <= default_nthread() <= (os.cpu_count() or 1)
    True
    """
    total = os.cpu_count() or 1
    allowed = usable_cpus()
    return max(1, allowed - 1) if allowed >= total else max(1, allowed)


def _check(X: np.ndarray, y: np.ndarray, feature_names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    X = np.asarray(X, dtype=np.float32)
    y = np.asarray(y, dtype=np.float64)
    if X.ndim != 2:
        raise TrainingError(f"X must be 2-D (got shape {X.shape})")
    if y.ndim != 1 or y.shape[0] != X.shape[0]:
        raise TrainingError(f"y must be 1-D with one value per row of X (X {X.shape}, y {y.shape})")
    if len(feature_names) != X.shape[1]:
        raise TrainingError(f"{len(feature_names)} feature names for {X.shape[1]} columns")
    if len(set(feature_names)) != len(feature_names):
        raise TrainingError("feature names must be unique")
    bad = next((n for n in feature_names if xgboost_refuses(n)), None)
    if bad is not None:  # XGBoost's own error names none of them
        raise TrainingError(f"feature name {shown_name(bad)}: XGBoost takes no name with [, ] or <"
                            " (the topic contracts refuse such a sample)")
    keep = np.isfinite(y)
    if not keep.all():
        log.debug("dropping %d rows without a finite RTT", int((~keep).sum()))
        X, y = X[keep], y[keep]
    return X, y


def train_model(
    X: np.ndarray,
    y: np.ndarray,
    feature_names: Sequence[str],
    node_class: str,
    *,
    holdout_fraction: float = 0.2,
    max_samples: int | None = 50_000,
    seed: int = 0,
    params: dict[str, Any] | None = None,
) -> TrainResult:
    """Train an XGBoost regressor of RTT (ms) on time-ordered rows.

    Parameters
    ----------
    X, y
        Features (rows in time order, NaN = missing) and observed RTT in ms; rows whose RTT is not
        finite are dropped, and so are rows whose RTT is not positive under a log-link objective
        (``reg:gamma``, ``reg:tweedie``, ``count:poisson``).
    feature_names
        One name per column of ``X``; the booster keeps them.
    node_class
        ``"cpu"`` or ``"gpu"``: picks the preset of :func:`app.model.presets.xgb_params`.
    holdout_fraction
        The most recent fraction of rows kept out of training for the metrics, in ``[0, 0.9]``;
        0 = metrics on the training rows themselves.
    max_samples
        Cap on training rows (:func:`app.model.balance.stratified_sample`); ``None`` = no cap.
    seed
        Seeds XGBoost's subsampling and the balancing.
    params
        Overrides merged over the preset (``n_estimators`` = number of boosting rounds); ``nthread``
        defaults to :func:`default_nthread`.

    Returns
    -------
    TrainResult
        The booster (set to predict on the CPU, wherever it trained), names, merged params and metrics.

    Raises
    ------
    NotEnoughSamplesError
        Fewer than ``MIN_SAMPLES`` usable rows (``n``: the usable rows), or fewer than half that left to
        train on after the holdout (``n``: the rows left).
    TrainingError
        Mismatched shapes, feature names or arguments.
    """
    if not 0.0 <= holdout_fraction <= 0.9:
        raise TrainingError(f"holdout_fraction: must be between 0 and 0.9 (got {holdout_fraction})")
    if max_samples is not None and max_samples < MIN_SAMPLES:
        raise TrainingError(f"max_samples: must be >= {MIN_SAMPLES} or None (got {max_samples})")
    X, y = _check(X, y, feature_names)
    overrides = dict(params or {})
    merged: dict[str, Any] = {**xgb_params(node_class, device=overrides.get("device")), "seed": seed,
                              "nthread": default_nthread(), **overrides}
    if merged.get("objective") in POSITIVE_OBJECTIVES:
        keep = y > 0
        if not keep.all():
            log.debug("dropping %d rows with RTT <= 0 (objective %s)", int((~keep).sum()), merged["objective"])
            X, y = X[keep], y[keep]
    n = y.shape[0]
    if n < MIN_SAMPLES:
        raise NotEnoughSamplesError(n, MIN_SAMPLES)
    n_holdout = int(math.ceil(n * holdout_fraction)) if holdout_fraction > 0 else 0
    n_fit = n - n_holdout
    if n_fit < MIN_SAMPLES // 2:
        raise NotEnoughSamplesError(n_fit, MIN_SAMPLES // 2, f"samples left after holding out {n_holdout}")
    X_fit, y_fit = X[:n_fit], y[:n_fit]
    if max_samples is not None and n_fit > max_samples:
        idx = stratified_sample(y_fit, max_samples, rng=np.random.default_rng(seed))
        X_fit, y_fit = X_fit[idx], y_fit[idx]

    booster_params = dict(merged)
    rounds = int(booster_params.pop("n_estimators", 100))
    names = tuple(feature_names)
    try:
        dtrain = xgboost.DMatrix(X_fit, label=y_fit, feature_names=list(names), missing=np.nan)
    except ValueError as exc:
        raise TrainingError(f"feature names: {exc}") from exc
    booster = xgboost.train(booster_params, dtrain, num_boost_round=rounds)
    booster.set_param({"device": "cpu"})  # inputs to predict are host arrays, wherever it trained

    if n_holdout:
        X_eval, y_eval = X[n_fit:], y[n_fit:]
    else:
        X_eval, y_eval = X_fit, y_fit
    metrics = evaluate(lambda A: booster.inplace_predict(A, missing=np.nan), X_eval, y_eval)
    metrics.pop("n")
    metrics["n_train"] = float(y_fit.shape[0])
    metrics["n_holdout"] = float(n_holdout)
    log.info("trained %s model: %d rounds, %d rows, holdout rmse %.1f ms", node_class, rounds,
             y_fit.shape[0], metrics["rmse_ms"])
    return TrainResult(booster=booster, feature_names=names, params=merged, metrics=metrics)


def booster_to_bytes(booster: xgboost.Booster, fmt: str = "ubj") -> bytes:
    """The booster in XGBoost's own ``"ubj"`` (binary JSON) or ``"json"`` format."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt: must be one of {FORMATS} (got {fmt!r})")
    return bytes(booster.save_raw(raw_format=fmt))


def booster_from_bytes(raw: bytes) -> xgboost.Booster:
    """A booster from :func:`booster_to_bytes` output (XGBoost detects UBJ or JSON itself)."""
    if not raw:
        raise ModelFormatError("empty model blob")
    booster = xgboost.Booster()
    try:
        booster.load_model(bytearray(raw))
    except xgboost.core.XGBoostError as exc:
        raise ModelFormatError(f"not an XGBoost model blob: {str(exc).splitlines()[0]}") from exc
    return booster
