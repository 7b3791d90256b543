"""Accumulate node-features, node-weights, running apps and models; build immutable snapshots from them.

The builder is the only mutable part of the view and is owned by one background task. Messages may arrive
twice or out of order (a warm start from Redis, then the compacted topics from their beginning): a node's
features or weights only move forward in ``ts``, a model only forward in ``version``.

Rows are cached per (model, node) and recomputed only for nodes whose features changed: a model whose node
class saw no change keeps its entry, and one whose nodes are the same gets a copy of its matrix with the
changed rows replaced. :meth:`SnapshotBuilder.build_steps` builds in steps (a generator that yields every
few hundred nodes), so the extender can interleave a rebuild of thousands of nodes with requests;
:meth:`SnapshotBuilder.build` runs the steps in one go.

>>> from app.scheduler.snapshot import SnapshotHolder
>>> b = SnapshotBuilder()
>>> b.apply_node_features({"node": "gpu-1", "ts": 100.0, "node_class": "gpu", "gpu_model": "Tesla M40",
...                        "window_s": 30, "count": 30, "features": {"cpu_iowait__mean": 0.1}})
True
>>> b.apply_node_weights({"node": "gpu-1", "ts": 101.0, "weight": 0.9, "predicted_rtt_ms": {}, "stale": False})
True
>>> snap = b.build(now=102.0)
>>> snap.nodes["gpu-1"].weight, snap.nodes["gpu-1"].features["hw_gpu_mem_gb"], snap.data_ts
(0.9, 12.0, 100.0)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Generator, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from app.contracts.keys import parse_model_key
from app.features.groups import is_stale
from app.features.hardware import hardware_features, node_counts
from app.features.vector import TASK_FEATURES, row
from app.model.base import Predictor
from app.scheduler.entries import ModelEntry, NodeState
from app.scheduler.snapshot import Snapshot
from app.scheduler.table import CHUNK, AppRoutes, NodeTable, app_routes_steps, apps_steps, node_table_steps, run_steps


@dataclasses.dataclass(frozen=True, slots=True)
class _Model:
    key: str
    version: int
    predictor: Predictor
    app: str
    node_class: str
    node: str | None
    feature_names: tuple[str, ...]


ROWS_PER_STEP = 32  # feature rows converted between two yields of a build in steps (~10 us each)
COPY_ROWS = 1024  # matrix rows copied between two yields (a 46-feature row is 184 bytes)


def node_features_map(value: Mapping[str, Any]) -> dict[str, float]:
    """A node-features message as model features: its ``features`` (minus stale metrics) + hardware.

    ``hw_cpu_cores`` comes from the node's ``cpu_count`` metric (NaN when the node does not report one).

    >>> f = node_features_map({"node": "c", "node_class": "cpu", "features": {"cpu_count__last": 16.0}})
    >>> f["hw_cpu_cores"], "hw_gpu_mem_gb" in f
    (16.0, False)
    """
    stale = value.get("stale")
    raw = value["features"]
    if stale:
        gone = frozenset(stale)
        features = {k: float(v) for k, v in raw.items() if not is_stale(k, gone)}
    else:
        features = {k: float(v) for k, v in raw.items()}
    for k, v in _known_hardware(value["node_class"], value.get("gpu_model"), *node_counts(features)):
        if k not in features:
            features[k] = v
    return features


@functools.lru_cache(maxsize=4096)
def _known_hardware(node_class: str, gpu_model: str | None, cores: float | None,
                    gpus: float | None = None) -> tuple[tuple[str, float], ...]:
    """The hardware descriptors that are known (not NaN): the same few per node class, GPU model and counts."""
    return tuple((k, v) for k, v in hardware_features(node_class, gpu_model, cores, gpus).items() if not math.isnan(v))


_NO_APP_FEATURES: Mapping[str, Mapping[str, float]] = MappingProxyType({})


class SnapshotBuilder:
    """Mutable accumulator of the global view; :meth:`build` returns a new immutable :class:`Snapshot`."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeState] = {}
        self._models: dict[str, _Model] = {}
        self._rows: dict[str, dict[str, tuple[int, np.ndarray]]] = {}  # model key -> node -> (version, row)
        self._entries: dict[str, tuple[tuple[int, int], ModelEntry]] = {}  # model key -> (signature, entry)
        self._epochs: dict[str, int] = {}  # node class -> bumps whenever a node of the class changes features
        self.dirty = False

    # -- inputs
    def apply_node_features(self, value: Mapping[str, Any]) -> bool:
        """Apply one (valid) node-features value; False when older than what the view has."""
        name = value["node"]
        old = self._nodes.get(name) or NodeState(name)
        ts = float(value["ts"])
        if ts < old.features_ts:
            return False
        node_class = value["node_class"]
        self._touch(old.node_class, node_class)
        stale = value.get("stale")
        gone = frozenset(stale) if stale else frozenset()
        per_app = value.get("app_features")
        app_features = MappingProxyType({str(a): MappingProxyType({k: float(v) for k, v in f.items()
                                                                   if not is_stale(k, gone)})
                                         for a, f in per_app.items()}) if per_app else _NO_APP_FEATURES
        # built field by field rather than with dataclasses.replace: this runs for every message of the feed
        self._nodes[name] = NodeState(
            name=name, node_class=node_class, gpu_model=value.get("gpu_model"),
            features=MappingProxyType(node_features_map(value)), features_ts=ts, stale_metrics=gone,
            weight=old.weight, weights_ts=old.weights_ts, weights_stale=old.weights_stale,
            predicted_rtt_ms=old.predicted_rtt_ms, running=old.running, running_ts=old.running_ts,
            version=old.version + 1, app_features=app_features, correction=old.correction, samples=old.samples,
        )
        self.dirty = True
        return True

    def apply_node_weights(self, value: Mapping[str, Any]) -> bool:
        """Apply one (valid) node-weights value; False when older than what the view has."""
        name = value["node"]
        old = self._nodes.get(name) or NodeState(name)
        ts = float(value["ts"])
        if ts < old.weights_ts:
            return False
        node_class = old.node_class or value.get("node_class")
        gpu_model = old.gpu_model if old.node_class else value.get("gpu_model")
        self._nodes[name] = dataclasses.replace(
            old, weight=float(value["weight"]), weights_ts=ts, weights_stale=bool(value["stale"]),
            predicted_rtt_ms=MappingProxyType({k: float(v) for k, v in value["predicted_rtt_ms"].items()}),
            node_class=node_class, gpu_model=gpu_model,
            correction=MappingProxyType({k: float(v) for k, v in (value.get("correction") or {}).items()}),
            samples=MappingProxyType({k: int(v) for k, v in (value.get("samples") or {}).items()}),
        )
        self.dirty = True
        return True

    def apply_running(self, node: str, apps: Mapping[str, int], ts: float | None = None,
                      rewind: bool = False) -> None:
        """Replace the running-apps view of ``node`` (app -> running pods), current at ``ts`` when known.

        The stamp only moves forward, unless ``rewind``: a view found stale shows the pods only up to when
        it was last confirmed, so the stamp goes back to ``ts`` and the assumed pods placed since count again.
        A node known from this view only (no node-features, no node-weights: never scraped, or removed by its
        tombstone while pods still ran there) is forgotten when nothing runs there any more.
        """
        known = self._nodes.get(node)
        clean = {str(a): int(c) for a, c in apps.items() if int(c) > 0}
        if not clean and (known is None or (known.features_ts <= 0 and known.weights_ts <= 0)):
            if known is not None:
                self.remove_node(node)
            return
        old = known or NodeState(node)
        stamp = old.running_ts if ts is None else ts if rewind else max(old.running_ts, ts)
        if dict(old.running) != clean or stamp != old.running_ts:
            self._nodes[node] = dataclasses.replace(old, running=MappingProxyType(clean), running_ts=stamp)
            self.dirty = True

    def remove_node(self, node: str) -> None:
        """Forget a node (a tombstone on a compacted topic)."""
        old = self._nodes.pop(node, None)
        if old is not None:
            self._touch(old.node_class)
            self.dirty = True

    def _touch(self, *node_classes: str | None) -> None:
        """Model matrices of these classes must be looked at again by the next build."""
        for c in node_classes:
            if c is not None:
                self._epochs[c] = self._epochs.get(c, 0) + 1

    def set_model(self, key: str, version: int, predictor: Predictor) -> bool:
        """Install a model; False (ignored) when the view already has this or a newer version."""
        current = self._models.get(key)
        if current is not None and current.version >= version:
            return False
        app, node_class, node = parse_model_key(key)
        self._models[key] = _Model(key, int(version), predictor, app, node_class, node, tuple(predictor.feature_names))
        self._rows.pop(key, None)
        self._entries.pop(key, None)
        self.dirty = True
        return True

    def model_version(self, key: str) -> int | None:
        m = self._models.get(key)
        return m.version if m else None

    @property
    def node_count(self) -> int:
        return len(self._nodes)

    # -- output
    def _scope_steps(self, m: _Model, nodes: Mapping[str, NodeState],
                     states: list[NodeState]) -> Generator[None, None, list[NodeState]]:
        if m.node is not None:
            n = nodes.get(m.node)
            return [n] if n is not None and n.features_ts > 0 and n.node_class == m.node_class else []
        scope: list[NodeState] = []
        for start in range(0, len(states), CHUNK):
            scope.extend(n for n in states[start:start + CHUNK] if n.features_ts > 0 and n.node_class == m.node_class)
            yield
        return scope

    def _entry_steps(self, m: _Model, nodes: Mapping[str, NodeState],
                     states: list[NodeState]) -> Generator[None, None, ModelEntry]:
        """The model's entry: reused while no node of its class changed, else only changed rows converted."""
        signature = (m.version, self._epochs.get(m.node_class, 0))
        cached = self._entries.get(m.key)
        if cached is not None and cached[0] == signature:
            return cached[1]
        scope = yield from self._scope_steps(m, nodes, states)
        in_scope: list[str] = []
        for start in range(0, len(scope), CHUNK):  # states written at different times: scattered, read in chunks
            in_scope.extend(n.name for n in scope[start:start + CHUNK])
            yield
        names = tuple(in_scope)
        rows = self._rows.setdefault(m.key, {})
        prev = cached[1] if cached is not None and cached[1].version == m.version else None
        same_scope = prev is not None and tuple(prev.row_index) == names
        yield
        if prev is not None and same_scope:
            matrix = prev.matrix
        else:
            matrix = np.empty((len(scope), len(m.feature_names)), dtype=np.float32)
        changed = not same_scope
        converted = 0
        for start in range(0, len(scope), CHUNK):
            for i in range(start, min(start + CHUNK, len(scope))):
                n = scope[i]
                hit = rows.get(n.name)
                if hit is None or hit[0] != n.version:
                    hit = rows[n.name] = (n.version, row(n.features_for(m.app), m.feature_names))
                    converted += 1
                    if converted % ROWS_PER_STEP == 0:
                        yield
                elif same_scope:
                    continue
                if not changed:  # first changed row of an unchanged scope: copy the old (read-only) matrix
                    matrix = yield from _copy_steps(matrix)
                    changed = True
                matrix[i] = hit[1]
            yield
        if prev is not None and not changed:
            self._entries[m.key] = (signature, prev)
            return prev
        if not same_scope:
            for gone in set(rows).difference(names):
                del rows[gone]
            yield
        matrix.setflags(write=False)
        entry = ModelEntry(
            key=m.key, version=m.version, predictor=m.predictor, feature_names=m.feature_names,
            task_columns=MappingProxyType({t: m.feature_names.index(t) for t in TASK_FEATURES if t in m.feature_names}),
            row_index=prev.row_index if same_scope and prev is not None else MappingProxyType(
                dict(zip(names, range(len(names)), strict=True))),
            matrix=matrix,
        )
        self._entries[m.key] = (signature, entry)
        return entry

    def build_steps(self, now: float) -> Generator[None, None, Snapshot]:
        """Build a new immutable snapshot in steps, yielding every few hundred nodes (the snapshot is returned).

        Clears :attr:`dirty` when it starts: what is applied while the steps run marks the builder dirty again
        and goes into the next build. Only one build may run at a time.
        """
        self.dirty = False
        nodes = dict(self._nodes)
        states = list(nodes.values())
        yield
        models: dict[str, ModelEntry] = {}
        for key, m in list(self._models.items()):
            models[key] = yield from self._entry_steps(m, nodes, states)
        table = yield from node_table_steps(nodes)
        columns: dict[str, NodeTable | AppRoutes | None] = {"": table}
        apps = yield from apps_steps(models, nodes)
        for app in sorted(apps):
            columns[app] = yield from app_routes_steps(app, table, models, nodes)
        data_ts = float(table.features_ts.max()) if len(table) else 0.0
        snap = Snapshot(nodes=MappingProxyType(nodes), models=MappingProxyType(models), built_at=now, data_ts=data_ts)
        snap._apps.append(apps)
        return snap.with_columns(columns)

    def build(self, now: float) -> Snapshot:
        """A new immutable snapshot of everything applied so far (:meth:`build_steps` in one go)."""
        return run_steps(self.build_steps(now))


def _copy_steps(matrix: np.ndarray) -> Generator[None, None, np.ndarray]:
    """A writable copy of ``matrix``, :data:`COPY_ROWS` rows between two yields (thousands of nodes: a few MB)."""
    out = np.empty_like(matrix)
    for start in range(0, len(matrix), COPY_ROWS):
        out[start:start + COPY_ROWS] = matrix[start:start + COPY_ROWS]
        yield
    return out
