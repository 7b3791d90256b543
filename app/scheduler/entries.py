"""What the global view holds per node (:class:`NodeState`) and per current model (:class:`ModelEntry`).

:class:`~app.scheduler.snapshot.Snapshot` is made of them and :mod:`app.scheduler.table` lays them out as
columns; both import them from here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from app.model.base import Predictor

_EMPTY: Mapping[str, float] = MappingProxyType({})
_NONE: Mapping[str, int] = MappingProxyType({})
_NO_APP_FEATURES: Mapping[str, Mapping[str, float]] = MappingProxyType({})


@dataclasses.dataclass(frozen=True, slots=True)
class NodeState:
    """What the view knows about one node. ``features_ts`` is 0 until node-features arrived."""

    name: str
    node_class: str | None = None
    gpu_model: str | None = None
    features: Mapping[str, float] = dataclasses.field(default_factory=lambda: _EMPTY)  # + hardware descriptors
    features_ts: float = 0.0
    stale_metrics: frozenset[str] = frozenset()
    weight: float | None = None  # credibility from node-weights; None = never evaluated
    weights_ts: float = 0.0
    weights_stale: bool = False
    predicted_rtt_ms: Mapping[str, float] = dataclasses.field(default_factory=lambda: _EMPTY)  # per app
    running: Mapping[str, int] = dataclasses.field(default_factory=lambda: _NONE)  # app -> running pods
    running_ts: float = 0.0  # up to when ``running`` shows the pods placed (0: unknown)
    version: int = 0  # bumps whenever ``features`` change
    app_features: Mapping[str, Mapping[str, float]] = dataclasses.field(  # app -> features over its DWA window
        default_factory=lambda: _NO_APP_FEATURES)
    correction: Mapping[str, float] = dataclasses.field(default_factory=lambda: _EMPTY)  # app -> residual factor
    samples: Mapping[str, int] = dataclasses.field(default_factory=lambda: _NONE)  # app -> completed tasks seen

    def features_for(self, app: str) -> Mapping[str, float]:
        """The features a model of ``app`` reads: ``app_features[app]`` over the node's ``features``."""
        own = self.app_features.get(app)
        return {**self.features, **own} if own else self.features


@dataclasses.dataclass(frozen=True, slots=True, weakref_slot=True)
class ModelEntry:
    """A loaded model and its pre-built rows for the nodes in its scope (weakly referable: what is remembered
    per entry between requests must not keep a retired model or old rows alive)."""

    key: str
    version: int
    predictor: Predictor
    feature_names: tuple[str, ...]
    task_columns: Mapping[str, int]  # task feature name -> column
    row_index: Mapping[str, int]  # node -> row of ``matrix``
    matrix: np.ndarray  # float32 (len(row_index), len(feature_names)), read-only

    def rows(self, nodes: list[str], task_features: Mapping[str, float]) -> np.ndarray:
        """A fresh matrix for ``nodes`` (all in :attr:`row_index`) with the task columns filled."""
        X = self.matrix[[self.row_index[n] for n in nodes]]
        for name, col in self.task_columns.items():
            X[:, col] = task_features.get(name, math.nan)
        return X
