"""Training samples and models of the RTT-aware policy, one model per app x node class.

Samples are the features the scheduler saw for the chosen node at decision time (node-features with
hardware descriptors, plus ``task_input_size_mb``) and the RTT observed later, kept in time order and
bounded. Training calls the production code: :func:`app.features.selection.select_features` picks the
metric features (hardware descriptors and task attributes always stay), then
:func:`app.model.train.train_model` fits XGBoost with the node class's preset and
:meth:`app.model.fast.FastPredictor.from_booster` makes the predictor the scheduler calls.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from app.features.hardware import HARDWARE_FEATURES
from app.features.selection import select_features
from app.features.vector import TASK_FEATURES, matrix
from app.model.errors import TrainingError
from app.model.fast import FastPredictor
from app.model.train import train_model

log = logging.getLogger(__name__)

ALWAYS = frozenset(HARDWARE_FEATURES) | frozenset(TASK_FEATURES)
SELECTION_ROWS = 400  # most recent rows the five measures look at


@dataclasses.dataclass
class Trained:
    predictor: FastPredictor
    version: int
    n_samples: int  # samples ever added to the key when this model was trained
    at_s: float
    features: tuple[str, ...]
    holdout: dict[str, float]


class ModelBook:
    """Samples and current models per model key (``app:node_class``)."""

    def __init__(self, *, max_samples: int = 1000, select: bool = True, seed: int = 0,
                 train_params: Mapping[str, Any] | None = None) -> None:
        if max_samples < 50:
            raise ValueError(f"max_samples: must be >= 50 (got {max_samples})")
        self.max_samples = max_samples
        self.select = select
        self.seed = seed
        self.train_params: dict[str, Any] = {"nthread": 1, **(train_params or {})}
        self._rows: dict[str, deque[tuple[Mapping[str, float], float]]] = {}
        self.added: dict[str, int] = {}  # samples ever added per key (the deque keeps the newest)
        self.models: dict[str, Trained] = {}
        self._chosen: dict[str, tuple[str, ...]] = {}
        self.selections: dict[str, tuple[str, ...]] = {}

    def add(self, key: str, features: Mapping[str, float], rtt_ms: float) -> int:
        rows = self._rows.get(key)
        if rows is None:
            rows = self._rows[key] = deque(maxlen=self.max_samples)
        rows.append((features, rtt_ms))
        self.added[key] = self.added.get(key, 0) + 1
        return len(rows)

    def n_samples(self, key: str) -> int:
        rows = self._rows.get(key)
        return len(rows) if rows else 0

    def _names(self, key: str, rows: list[Mapping[str, float]], y: np.ndarray, reselect: bool) -> list[str]:
        names = sorted({k for r in rows for k in r})
        metric_names = [n for n in names if n not in ALWAYS]
        if not self.select or not metric_names:
            return names
        if reselect or key not in self._chosen:
            tail = rows[-SELECTION_ROWS:]
            X = matrix(tail, metric_names).astype(np.float64)
            res = select_features(X, y[-SELECTION_ROWS:], metric_names)
            self._chosen[key] = tuple(res.chosen) if res.chosen else tuple(metric_names)
            self.selections[key] = tuple(res.chosen)
        keep = set(self._chosen[key])
        return [n for n in names if n in keep or n in ALWAYS]

    def train(self, key: str, node_class: str, now_s: float, *, reselect: bool = False) -> Trained | None:
        """(Re)train ``key`` on its samples so far; None when it cannot (too few samples, degenerate data)."""
        data = list(self._rows.get(key, ()))
        if len(data) < 20:
            return None
        rows = [r for r, _ in data]
        y = np.array([v for _, v in data], dtype=np.float64)
        names = self._names(key, rows, y, reselect)
        X = matrix(rows, names)
        try:
            res = train_model(X, y, names, node_class, holdout_fraction=0.2, max_samples=None, seed=self.seed,
                              params=self.train_params)
        except TrainingError as exc:
            log.info("training %s skipped: %s", key, exc)
            return None
        old = self.models.get(key)
        trained = Trained(FastPredictor.from_booster(res.booster), (old.version + 1) if old else 1, self.added[key],
                          now_s, tuple(names), dict(res.metrics))
        self.models[key] = trained
        return trained
