"""One retrain, as a blocking function: split, select features, train the challenger, score both models.

Run off the event loop (the service uses a one-thread executor). Steps, for a key's rows in time order:

1. **Split**: the most recent ``ceil(holdout_fraction · n)`` rows are the holdout; the rest is the fit set.
2. **Select** (:func:`app.features.selection.select_features`) on the most recent ``selection_max_rows``
   fit rows, over the candidate columns that vary (≥ 2 distinct finite values). Hardware descriptors
   and task features (``hw_*``, ``task_input_size_mb``) that have any value are always kept: they are
   what lets a class model predict for a node it has never seen. When the selection keeps no
   candidate, every varying column is used (XGBoost ignores the useless ones at little cost).
3. **Train** (:func:`app.model.train.train_model`) on the fit rows and the kept columns, with the
   holdout excluded (``holdout_fraction=0``: the split is ours, so both models see the same holdout).
4. **Score** the challenger and, in :func:`score_champion`, the champion on the same holdout rows,
   each with its own feature names (a column the holdout lacks is missing, NaN).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from app.features.hardware import HARDWARE_FEATURES
from app.features.vector import TASK_FEATURES
from app.model.base import Predictor
from app.model.train import MIN_SAMPLES, TrainResult, evaluate, train_model
from app.trainer.history import Dataset

log = logging.getLogger(__name__)

ALWAYS_KEPT = frozenset(HARDWARE_FEATURES) | frozenset(TASK_FEATURES)
HOLDOUT_FRACTION = 0.2
SELECTION_MAX_ROWS = 2_000

Selector = Callable[[np.ndarray, np.ndarray, Sequence[str]], Sequence[str]]


@dataclasses.dataclass(frozen=True, eq=False)
class Challenger:
    """A trained challenger with the holdout it was scored on."""

    result: TrainResult
    holdout: Dataset
    metrics: dict[str, float]
    selected: tuple[str, ...]
    n_fit: int
    fit_window: tuple[float, float]
    seconds: float


def default_selector(X: np.ndarray, y: np.ndarray, names: Sequence[str]) -> Sequence[str]:
    """The project's feature selection (five correlation measures, 3-of-5 vote)."""
    from app.features.selection import select_features

    return tuple(select_features(X, y, list(names)).chosen)


def split(ds: Dataset, holdout_fraction: float = HOLDOUT_FRACTION) -> tuple[Dataset, Dataset]:
    """(fit, holdout): the holdout is the most recent ``ceil(fraction · n)`` rows.

    >>> import numpy as np
    >>> ds = Dataset(np.zeros((10, 1), np.float32), np.arange(10.0), np.arange(10.0), ("a",))
    >>> [len(p) for p in split(ds, 0.2)], split(ds, 0.2)[1].ts.tolist()
    ([8, 2], [8.0, 9.0])
    """
    if not 0.0 < holdout_fraction < 1.0:
        raise ValueError(f"holdout_fraction must be in (0, 1) (got {holdout_fraction})")
    n_holdout = max(1, math.ceil(len(ds) * holdout_fraction))
    n_fit = len(ds) - n_holdout
    return ds.rows(0, n_fit), ds.rows(n_fit)


def varying_columns(ds: Dataset) -> list[str]:
    """Names of the columns with at least two distinct finite values."""
    out = []
    for j, name in enumerate(ds.names):
        col = ds.X[:, j]
        finite = col[np.isfinite(col)]
        if finite.size >= 2 and finite.min() != finite.max():
            out.append(name)
    return out


def choose_features(fit: Dataset, selector: Selector | None, max_rows: int = SELECTION_MAX_ROWS) -> tuple[str, ...]:
    """The model's columns: the selector's choice among varying columns, plus :data:`ALWAYS_KEPT`.

    Without a selector, or when it keeps nothing, every varying column is used.
    """
    candidates = [n for n in varying_columns(fit) if n not in ALWAYS_KEPT]
    kept = [n for j, n in enumerate(fit.names) if n in ALWAYS_KEPT and np.isfinite(fit.X[:, j]).any()]
    chosen = candidates
    if selector is not None and candidates:
        recent = fit.rows(max(0, len(fit) - max_rows))
        picked = set(selector(recent.columns(candidates), recent.y, candidates))
        chosen = [n for n in candidates if n in picked] or candidates
    names = tuple(chosen + kept)
    return names if names else fit.names


def train_challenger(ds: Dataset, node_class: str, *, holdout_fraction: float = HOLDOUT_FRACTION,
                     selector: Selector | None = default_selector, selection_max_rows: int = SELECTION_MAX_ROWS,
                     seed: int = 0, params: dict[str, Any] | None = None) -> Challenger:
    """Split, select, train and score a challenger (blocking; raises the model layer's errors)."""
    t0 = time.perf_counter()
    fit, holdout = split(ds, holdout_fraction)
    if len(fit) < MIN_SAMPLES:
        from app.model.errors import NotEnoughSamplesError

        raise NotEnoughSamplesError(len(fit), MIN_SAMPLES)
    names = choose_features(fit, selector, selection_max_rows)
    result = train_model(fit.columns(names), fit.y, names, node_class, holdout_fraction=0.0, seed=seed,
                         params=params)
    metrics = score(lambda X: result.booster.inplace_predict(X, missing=np.nan), names, holdout)
    seconds = time.perf_counter() - t0
    log.info("challenger %s: %d fit rows, %d features, holdout rmse %.1f ms (%.2fs)", node_class, len(fit),
             len(names), metrics["rmse_ms"], seconds)
    window = (float(fit.ts[0]), float(fit.ts[-1]))
    return Challenger(result, holdout, metrics, names, len(fit), window, seconds)


def score(predict: Callable[[np.ndarray], np.ndarray], names: Sequence[str], holdout: Dataset) -> dict[str, float]:
    """Holdout metrics of a model that reads the columns ``names``; non-finite predictions make NaN metrics."""
    m = evaluate(predict, holdout.columns(names), holdout.y)
    return {k: float(v) for k, v in m.items()}


def score_champion(champion: Predictor, holdout: Dataset) -> dict[str, float]:
    """The champion's metrics on the challenger's holdout (its own feature names and order)."""
    return score(champion.predict, champion.feature_names, holdout)
