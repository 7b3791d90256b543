"""Training samples and models of the RTT-aware policy, one model per app x node class.

Samples are the features the scheduler saw for the chosen node at decision time (node-features with
hardware descriptors, the pods running on the node per app, ``task_input_size_mb``) and the task's
*service time* observed later (RTT minus the wait before placement, which the scheduler knows when it
decides). Rows are kept in time order and bounded. Training calls the production code:
:func:`app.features.selection.select_features` picks the metric features (hardware descriptors, running
pods and task attributes always stay), then :func:`app.model.train.train_model` fits XGBoost with the
node class's preset and :meth:`app.model.fast.FastPredictor.from_booster` makes the predictor the
scheduler calls.

Contention, throttling and the hardware act as *factors* on a task's time, which a sum of trees fits far
better in log space, and an error in log space is a relative error, as MAPE is. The default target
``"gamma"`` is XGBoost's ``reg:gamma`` (a log link on ms): the booster predicts ms itself, so the model
blob is an ordinary one for the trainer, registry and extender. ``"log"`` trains on log(ms) with squared
error instead and :class:`ExpPredictor` turns the output back into ms; ``"ms"`` is plain squared error.

>>> import numpy as np
>>> class Twice:
...     feature_names = ("x",)
...     def predict(self, X):
...         return 2.0 * X[:, 0].astype(np.float64)
>>> ExpPredictor(Twice()).predict(np.array([[0.0], [np.log(10.0) / 2]], dtype=np.float32)).round(3).tolist()
[1.0, 10.0]
>>> always_kept("running_pods_gCTF"), always_kept("hw_gpu_fp32_tflops"), always_kept("cpu_iowait__mean")
(True, True, False)
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from app.features.hardware import HARDWARE_FEATURES
from app.features.selection import select_features
from app.features.vector import TASK_FEATURES, matrix
from app.model.base import Predictor
from app.model.errors import TrainingError
from app.model.fast import FastPredictor
from app.model.train import train_model

log = logging.getLogger(__name__)

RUNNING_PREFIX = "running_pods_"  # node feature: pods of one app running on the node (scheduler's view)
ALWAYS = frozenset(HARDWARE_FEATURES) | frozenset(TASK_FEATURES)
SELECTION_ROWS = 400  # most recent rows the five measures look at
SELECT_FROM_ROWS = 100  # fewer rows: no metric features yet (the measures need data to vote on)
TARGETS = ("log", "ms", "gamma")
GPU_SPEED = frozenset({"hw_gpu_fp32_tflops", "hw_gpu_mem_bw_gbs", "hw_pcie_gen", "gpu_sm_clock_mhz"})
# load on a shared resource: more of it never makes a task faster; idle time is the opposite
LOAD_METRICS = frozenset({
    "nvidia_smi_utilization_gpu", "nvidia_smi_memory_used", "cuda_stream_active", "gpu_temperature",
    "pcie_rx_bytes", "pcie_tx_bytes", "cpu_usage_user", "cpu_usage_system", "cpu_iowait", "memory_cache_usage",
    "memory_used_fraction", "disk_read_bytes_per_s", "disk_written_bytes_per_s",
})
IDLE_METRICS = frozenset({"cpu_idle"})
LEVELS = frozenset({"mean", "min", "max", "last"})  # aggregates that move with the level (not ``std``)
MIN_ROWS = 20


def always_kept(name: str) -> bool:
    """Features that feature selection never drops: hardware, task attributes, running pods."""
    return name in ALWAYS or name.startswith(RUNNING_PREFIX)


def direction(name: str, gpu_app: bool) -> int:
    """How a task's time may move as feature ``name`` grows: +1 never faster, -1 never slower, 0 free.

    Larger inputs, more pods beside the task and more load on any shared resource never make it faster
    (level aggregates of load metrics; their ``std`` is free); for an app that runs on the GPU, a faster
    GPU (FP32 throughput, memory bandwidth, PCIe generation, SM clock) never slows it. The constraints
    keep a model from reading "busy" as "fast" because the fastest node is the busiest one, and let it
    rank a GPU it has rarely seen from few samples.

    >>> [direction(n, True) for n in ("task_input_size_mb", "running_pods_gCTF", "hw_gpu_fp32_tflops")]
    [1, 1, -1]
    >>> direction("hw_gpu_fp32_tflops", False), direction("cpu_iowait__mean", True), direction("cpu_idle__std", True)
    (0, 1, 0)
    """
    if name in TASK_FEATURES or name.startswith(RUNNING_PREFIX):
        return 1
    metric, _, agg = name.rpartition("__")
    if not metric:
        return -1 if gpu_app and name in GPU_SPEED else 0
    if agg not in LEVELS:
        return 0
    if metric in LOAD_METRICS:
        return 1
    if metric in IDLE_METRICS:
        return -1
    return -1 if gpu_app and metric in GPU_SPEED else 0


class ExpPredictor:
    """A predictor of log(ms) seen as a predictor of ms (:class:`app.model.base.Predictor`)."""

    def __init__(self, inner: Predictor) -> None:
        self.inner = inner

    @property
    def feature_names(self) -> tuple[str, ...]:
        return tuple(self.inner.feature_names)

    def predict(self, X: np.ndarray) -> np.ndarray:
        return np.exp(np.asarray(self.inner.predict(X), dtype=np.float64))


@dataclasses.dataclass
class Trained:
    predictor: Predictor
    version: int
    n_samples: int  # samples ever added to the key when this model was trained
    at_s: float
    features: tuple[str, ...]
    holdout: dict[str, float]


class ModelBook:
    """Samples and current models per model key (``app:node_class``).

    Parameters
    ----------
    max_samples
        Rows kept per key (the newest), ``>= 50``.
    select
        Run the five-measure feature selection on metric features (else every feature is used).
    seed
        Seeds XGBoost's subsampling.
    train_params
        Overrides of the XGBoost preset (e.g. fewer trees in a fast simulation).
    target
        ``"log"`` (squared error on log ms), ``"ms"`` (squared error on ms) or ``"gamma"``
        (XGBoost's ``reg:gamma``, a log link on ms).
    holdout_fraction
        Most recent fraction of rows :func:`train_model` keeps out for its metrics (not trained on).
    max_metric_features
        Keep at most this many of the chosen metric features, strongest first (None: all chosen).
    """

    def __init__(self, *, max_samples: int = 1000, select: bool = True, seed: int = 0,
                 train_params: Mapping[str, Any] | None = None, target: str = "gamma",
                 holdout_fraction: float = 0.0, max_metric_features: int | None = 12) -> None:
        if max_samples < 50:
            raise ValueError(f"max_samples: must be >= 50 (got {max_samples})")
        if target not in TARGETS:
            raise ValueError(f"target: must be one of {TARGETS} (got {target!r})")
        self.max_samples = max_samples
        self.select = select
        self.seed = seed
        self.target = target
        self.holdout_fraction = holdout_fraction
        self.max_metric_features = max_metric_features
        extra = {"objective": "reg:gamma"} if target == "gamma" else {}
        self.train_params: dict[str, Any] = {"nthread": 1, **extra, **(train_params or {})}
        self._rows: dict[str, deque[tuple[Mapping[str, float], float]]] = {}
        self.added: dict[str, int] = {}  # samples ever added per key (the deque keeps the newest)
        self.models: dict[str, Trained] = {}
        self._chosen: dict[str, tuple[str, ...]] = {}
        self._chosen_rows: dict[str, int] = {}  # rows the current selection looked at
        self.selections: dict[str, tuple[str, ...]] = {}

    def add(self, key: str, features: Mapping[str, float], service_ms: float) -> int:
        """Add one sample; returns the rows now kept for ``key``."""
        rows = self._rows.get(key)
        if rows is None:
            rows = self._rows[key] = deque(maxlen=self.max_samples)
        rows.append((features, service_ms))
        self.added[key] = self.added.get(key, 0) + 1
        return len(rows)

    def n_samples(self, key: str) -> int:
        rows = self._rows.get(key)
        return len(rows) if rows else 0

    def _names(self, key: str, rows: list[Mapping[str, float]], y: np.ndarray, reselect: bool) -> list[str]:
        """Features to train on: the always-kept ones plus the metric features selection chose.

        Below ``SELECT_FROM_ROWS`` rows no metric feature is used (too few rows for dozens of them).
        Selection runs at the first training with ``SELECT_FROM_ROWS`` rows, again once ``SELECTION_ROWS``
        rows are there, and on every drift (``reselect``).
        """
        names = sorted({k for r in rows for k in r})
        metric_names = [n for n in names if not always_kept(n)]
        if len(rows) < SELECT_FROM_ROWS:
            return [n for n in names if always_kept(n)]
        if not self.select or not metric_names:
            return names
        seen = self._chosen_rows.get(key, 0)
        if reselect or seen == 0 or seen < SELECTION_ROWS <= len(rows):
            tail = rows[-SELECTION_ROWS:]
            X = matrix(tail, metric_names).astype(np.float64)
            res = select_features(X, y[-SELECTION_ROWS:], metric_names)
            chosen = res.chosen[:self.max_metric_features] if self.max_metric_features else res.chosen
            self._chosen[key] = tuple(chosen)
            self._chosen_rows[key] = len(tail)
            self.selections[key] = tuple(res.chosen)
        keep = set(self._chosen[key])
        return [n for n in names if n in keep or always_kept(n)]

    def train(self, key: str, node_class: str, now_s: float, *, reselect: bool = False,
              gpu_app: bool | None = None) -> Trained | None:
        """(Re)train ``key`` on its samples so far; None when it cannot (too few samples, degenerate data).

        ``gpu_app``: constrain the model to :func:`direction` (XGBoost's ``monotone_constraints``) for an
        app that runs on the GPU (True) or not (False); None: unconstrained.
        """
        data = [(r, v) for r, v in self._rows.get(key, ()) if v > 0 and math.isfinite(v)]
        if len(data) < MIN_ROWS:
            return None
        rows = [r for r, _ in data]
        y = np.array([v for _, v in data], dtype=np.float64)
        names = self._names(key, rows, y, reselect)
        X = matrix(rows, names)
        label = np.log(y) if self.target == "log" else y
        params = dict(self.train_params)
        constraints = {} if gpu_app is None else {n: d for n in names if (d := direction(n, gpu_app))}
        if constraints:
            params["monotone_constraints"] = constraints
        try:
            res = train_model(X, label, names, node_class, holdout_fraction=self.holdout_fraction, max_samples=None,
                              seed=self.seed, params=params)
        except TrainingError as exc:
            log.info("training %s skipped: %s", key, exc)
            return None
        fast = FastPredictor.from_booster(res.booster)
        predictor: Predictor = ExpPredictor(fast) if self.target == "log" else fast
        old = self.models.get(key)
        trained = Trained(predictor, (old.version + 1) if old else 1, self.added[key], now_s, tuple(names),
                          dict(res.metrics))
        self.models[key] = trained
        return trained
