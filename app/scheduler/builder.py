"""Accumulate node-features, node-weights, running apps and models; build immutable snapshots from them.

The builder is the only mutable part of the view and is owned by one background task. Messages may arrive
twice or out of order (a warm start from Redis, then the compacted topics from their beginning): a node's
features or weights only move forward in ``ts``, a model only forward in ``version``.

Rows are cached per (model, node) and recomputed only for nodes whose features changed, so rebuilding a
snapshot after one message costs O(nodes) pointer copies, not O(nodes × features) conversions.

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
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from app.contracts.keys import parse_model_key
from app.features.hardware import hardware_features
from app.features.vector import TASK_FEATURES, row, split_feature_name
from app.model.base import Predictor
from app.scheduler.snapshot import ModelEntry, NodeState, Snapshot


@dataclasses.dataclass(frozen=True, slots=True)
class _Model:
    key: str
    version: int
    predictor: Predictor
    node_class: str
    node: str | None


CPU_CORES = "cpu_count__last"  # the bridge's ``cpu_count`` gauge (distinct ``cpu`` labels of node_exporter)


def node_features_map(value: Mapping[str, Any]) -> dict[str, float]:
    """A node-features message as model features: its ``features`` (minus stale metrics) + hardware.

    ``hw_cpu_cores`` comes from the node's ``cpu_count`` metric (NaN when the node does not report one).

    >>> f = node_features_map({"node": "c", "node_class": "cpu", "features": {"cpu_count__last": 16.0}})
    >>> f["hw_cpu_cores"], "hw_gpu_mem_gb" in f
    (16.0, False)
    """
    stale = set(value.get("stale") or ())
    features = {k: float(v) for k, v in value["features"].items() if split_feature_name(k)[0] not in stale}
    cores = features.get(CPU_CORES)
    cores = cores if cores is not None and math.isfinite(cores) and cores > 0 else None
    for k, v in hardware_features(value["node_class"], value.get("gpu_model"), cores).items():
        if k not in features and not math.isnan(v):
            features[k] = v
    return features


class SnapshotBuilder:
    """Mutable accumulator of the global view; :meth:`build` returns a new immutable :class:`Snapshot`."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeState] = {}
        self._models: dict[str, _Model] = {}
        self._rows: dict[str, dict[str, tuple[int, np.ndarray]]] = {}  # model key -> node -> (version, row)
        self._entries: dict[str, tuple[tuple[tuple[str, int], ...], ModelEntry]] = {}
        self.dirty = False

    # -- inputs
    def apply_node_features(self, value: Mapping[str, Any]) -> bool:
        """Apply one (valid) node-features value; False when older than what the view has."""
        name = value["node"]
        old = self._nodes.get(name) or NodeState(name)
        ts = float(value["ts"])
        if ts < old.features_ts:
            return False
        stale = set(value.get("stale") or ())
        app_features = {str(a): MappingProxyType({k: float(v) for k, v in f.items()
                                                  if split_feature_name(k)[0] not in stale})
                        for a, f in (value.get("app_features") or {}).items()}
        self._nodes[name] = dataclasses.replace(
            old, node_class=value["node_class"], gpu_model=value.get("gpu_model"),
            features=MappingProxyType(node_features_map(value)), features_ts=ts,
            stale_metrics=frozenset(stale), version=old.version + 1, app_features=MappingProxyType(app_features),
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

    def apply_running(self, node: str, apps: Mapping[str, int], ts: float | None = None) -> None:
        """Replace the running-apps view of ``node`` (app -> running pods), read at ``ts`` when known."""
        old = self._nodes.get(node) or NodeState(node)
        clean = {str(a): int(c) for a, c in apps.items() if int(c) > 0}
        if dict(old.running) != clean or (ts is not None and ts > old.running_ts):
            self._nodes[node] = dataclasses.replace(old, running=MappingProxyType(clean),
                                                    running_ts=max(old.running_ts, ts or 0.0))
            self.dirty = True

    def remove_node(self, node: str) -> None:
        """Forget a node (a tombstone on a compacted topic)."""
        if self._nodes.pop(node, None) is not None:
            self.dirty = True

    def set_model(self, key: str, version: int, predictor: Predictor) -> bool:
        """Install a model; False (ignored) when the view already has this or a newer version."""
        current = self._models.get(key)
        if current is not None and current.version >= version:
            return False
        _, node_class, node = parse_model_key(key)
        self._models[key] = _Model(key, int(version), predictor, node_class, node)
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
    def _scope(self, m: _Model) -> list[NodeState]:
        if m.node is not None:
            n = self._nodes.get(m.node)
            return [n] if n is not None and n.features_ts > 0 and n.node_class == m.node_class else []
        return [n for n in self._nodes.values() if n.features_ts > 0 and n.node_class == m.node_class]

    def _entry(self, m: _Model) -> ModelEntry:
        scope = self._scope(m)
        signature = tuple((n.name, n.version) for n in scope)
        cached = self._entries.get(m.key)
        if cached is not None and cached[0] == signature:
            return cached[1]
        names = tuple(m.predictor.feature_names)
        app = m.key.split(":", 1)[0]
        rows = self._rows.setdefault(m.key, {})
        for gone in set(rows) - {n.name for n in scope}:
            del rows[gone]
        stacked = []
        for n in scope:
            hit = rows.get(n.name)
            if hit is None or hit[0] != n.version:
                hit = (n.version, row(n.features_for(app), names))
                rows[n.name] = hit
            stacked.append(hit[1])
        matrix = np.stack(stacked) if stacked else np.empty((0, len(names)), dtype=np.float32)
        matrix.setflags(write=False)
        entry = ModelEntry(
            key=m.key, version=m.version, predictor=m.predictor, feature_names=names,
            task_columns=MappingProxyType({t: names.index(t) for t in TASK_FEATURES if t in names}),
            row_index=MappingProxyType({n.name: i for i, n in enumerate(scope)}), matrix=matrix,
        )
        self._entries[m.key] = (signature, entry)
        return entry

    def build(self, now: float) -> Snapshot:
        """A new immutable snapshot of everything applied so far; clears :attr:`dirty`."""
        nodes = MappingProxyType(dict(self._nodes))
        models = MappingProxyType({k: self._entry(m) for k, m in self._models.items()})
        data_ts = max((n.features_ts for n in self._nodes.values()), default=0.0)
        self.dirty = False
        snap = Snapshot(nodes=nodes, models=models, built_at=now, data_ts=data_ts)
        for app in {m.key.split(":", 1)[0] for m in self._models.values()}:
            snap.routes(app)  # warm the per-app routing while still off the request path
        return snap
