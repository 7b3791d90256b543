"""The global view the extender scores from: immutable, built in the background, swapped in atomically.

A :class:`Snapshot` holds every known node (:class:`~app.scheduler.entries.NodeState`: features,
credibility, running apps) and every current model (:class:`~app.scheduler.entries.ModelEntry`) with its
feature matrix already laid out — one row per node in the model's scope, columns in the model's
``feature_names`` order — so a request only gathers rows and fills the task columns. Handlers read
:attr:`SnapshotHolder.current` once per request and never see a half-built view:
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

from app.contracts.keys import model_key
from app.scheduler.entries import ModelEntry, NodeState
from app.scheduler.table import (
    AppRoutes,
    Candidates,
    NodeTable,
    apps_of,
    build_app_routes,
    build_node_table,
    gather_candidates,
)

_NO_ROUTES: Mapping[str, ModelEntry] = MappingProxyType({})
MAX_CANDIDATE_LISTS = 16  # gathered candidate lists a snapshot keeps (the oldest goes first)


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
    _candidates: dict[tuple[str, float, tuple[str, ...]], Candidates] = dataclasses.field(
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

    def candidates(self, app: str, nodes: tuple[str, ...], prior: float) -> Candidates:
        """The table and ``app``'s routes gathered for ``nodes`` (:func:`~app.scheduler.table.gather_candidates`);
        the last :data:`MAX_CANDIDATE_LISTS` (app, prior, node list) are kept for the requests that follow."""
        key = (app, prior, nodes)
        found = self._candidates.get(key)
        if found is None:
            found = gather_candidates(self.table, self.app_routes(app), nodes, prior)
            while len(self._candidates) >= MAX_CANDIDATE_LISTS:
                del self._candidates[next(iter(self._candidates))]
            self._candidates[key] = found
        return found

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
