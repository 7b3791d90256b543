"""The global view the extender scores from: immutable, built in the background, swapped in atomically.

A :class:`Snapshot` holds every known node (:class:`NodeState`: features, credibility, running apps) and every
current model (:class:`ModelEntry`) with its feature matrix already laid out — one row per node in the model's
scope, columns in the model's ``feature_names`` order — so a request only gathers rows and fills the task
columns. Handlers read :attr:`SnapshotHolder.current` once per request and never see a half-built view:
:class:`~app.scheduler.builder.SnapshotBuilder` makes a new object and :meth:`SnapshotHolder.swap` replaces
the reference in one assignment.

>>> holder = SnapshotHolder()
>>> holder.ready
False
>>> holder.swap(Snapshot.empty(now=10.0)).generation
1
>>> holder.ready, holder.current.age(now=12.5)
(True, inf)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from app.contracts.keys import model_key
from app.model.base import Predictor
from app.scheduler.table import AppRoutes, NodeTable, apps_of, build_app_routes, build_node_table

_EMPTY: Mapping[str, float] = MappingProxyType({})
_NONE: Mapping[str, int] = MappingProxyType({})
_NO_ROUTES: Mapping[str, ModelEntry] = MappingProxyType({})
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
    running_ts: float = 0.0  # when ``running`` was read (0: unknown)
    version: int = 0  # bumps whenever ``features`` change
    app_features: Mapping[str, Mapping[str, float]] = dataclasses.field(  # app -> features over its DWA window
        default_factory=lambda: _NO_APP_FEATURES)
    correction: Mapping[str, float] = dataclasses.field(default_factory=lambda: _EMPTY)  # app -> residual factor
    samples: Mapping[str, int] = dataclasses.field(default_factory=lambda: _NONE)  # app -> completed tasks seen

    def features_for(self, app: str) -> Mapping[str, float]:
        """The features a model of ``app`` reads: ``app_features[app]`` over the node's ``features``."""
        own = self.app_features.get(app)
        return {**self.features, **own} if own else self.features

    def is_stale(self, now: float, stale_after_s: float) -> bool:
        """No features yet, features older than ``stale_after_s``, or node-weights flagged the node stale."""
        return self.features_ts <= 0 or now - self.features_ts > stale_after_s or self.weights_stale


@dataclasses.dataclass(frozen=True, slots=True)
class ModelEntry:
    """A loaded model and its pre-built rows for the nodes in its scope."""

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


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """An immutable global view. ``data_ts`` is the newest node-features timestamp in it (0 if none)."""

    nodes: Mapping[str, NodeState]
    models: Mapping[str, ModelEntry]
    built_at: float
    data_ts: float
    generation: int = 0
    _routes: dict[str, Mapping[str, ModelEntry]] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False)
    # column views (app.scheduler.table): "" -> NodeTable, app -> AppRoutes | None; filled by the builder
    _apps: list[frozenset[str]] = dataclasses.field(  # [known_apps()] once computed
        default_factory=list, init=False, repr=False, compare=False)
    _columns: dict[str, NodeTable | AppRoutes | None] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def empty(cls, now: float) -> Snapshot:
        return cls(MappingProxyType({}), MappingProxyType({}), built_at=now, data_ts=0.0)

    def age(self, now: float) -> float:
        """Seconds since the newest node-features in the view; infinite when there are none."""
        return now - self.data_ts if self.data_ts > 0 else math.inf

    def model_for(self, app: str, node: NodeState) -> ModelEntry | None:
        """The node's own model for ``app`` if it has one covering it, else the app × node-class model."""
        if node.node_class is None:
            return None
        own = self.models.get(model_key(app, node.node_class, node.name))
        if own is not None and node.name in own.row_index:
            return own
        shared = self.models.get(model_key(app, node.node_class))
        if shared is not None and node.name in shared.row_index:
            return shared
        return None

    @property
    def table(self) -> NodeTable:
        """Per-node columns (positions, timestamps, credibility, flags); the builder computes it in advance."""
        table = self._columns.get("")
        if table is None:
            table = self._columns[""] = build_node_table(self.nodes)
        return table  # type: ignore[return-value]

    def app_routes(self, app: str) -> AppRoutes | None:
        """Model, row and node-weights columns per node position for ``app``; None when neither a model nor
        node-weights know the app (not cached then). The builder computes the known apps' in advance."""
        if app in self._columns:
            return self._columns[app]  # type: ignore[return-value]
        if not app or app not in self.known_apps():
            return None  # app labels are unbounded input: only known apps are cached
        routes = self._columns[app] = build_app_routes(app, self.table, self.models, self.nodes)
        return routes

    def known_apps(self) -> frozenset[str]:
        """Apps with a model or named by some node's node-weights (the apps :meth:`app_routes` covers)."""
        if not self._apps:
            self._apps.append(apps_of(self.models, self.nodes))
        return self._apps[0]

    def with_columns(self, columns: Mapping[str, NodeTable | AppRoutes | None]) -> Snapshot:
        """This snapshot with precomputed column views (see :attr:`table`, :meth:`app_routes`)."""
        self._columns.update(columns)
        return self

    def routes(self, app: str) -> Mapping[str, ModelEntry]:
        """node -> the model :meth:`model_for` picks for ``app``; computed once per snapshot and app."""
        cached = self._routes.get(app)
        if cached is None:
            if not any(key.startswith(f"{app}:") for key in self.models):
                return _NO_ROUTES  # not cached: app labels are unbounded input
            found = {}
            for node in self.nodes.values():
                entry = self.model_for(app, node)
                if entry is not None:
                    found[node.name] = entry
            cached = self._routes[app] = MappingProxyType(found)
        return cached


class SnapshotHolder:
    """The one mutable reference to the current snapshot; None until the first swap (not ready)."""

    def __init__(self) -> None:
        self._current: Snapshot | None = None
        self._generation = 0

    @property
    def current(self) -> Snapshot | None:
        return self._current

    @property
    def ready(self) -> bool:
        return self._current is not None

    def swap(self, snapshot: Snapshot) -> Snapshot:
        """Install ``snapshot`` (stamped with the next generation) and return it."""
        self._generation += 1
        stamped = dataclasses.replace(snapshot, generation=self._generation)
        stamped._routes.update(snapshot._routes)
        stamped._columns.update(snapshot._columns)
        stamped._apps.extend(snapshot._apps)
        self._current = stamped
        return stamped
