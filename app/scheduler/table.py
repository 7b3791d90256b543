"""A snapshot's nodes as columns, per app: what :func:`app.scheduler.decide.decide` gathers with one index.

Scoring a pod on hundreds of candidates node by node costs milliseconds in Python; the same work on
arrays costs tens of microseconds. A :class:`NodeTable` is built once per snapshot and app (the snapshot is
immutable) and holds, aligned with ``names``: credibility, freshness inputs, the model that covers each
node for the app and its row in that model's matrix, node-weights' own prediction, the residual
correction and sample count for the app, and the running-apps view.

>>> from types import MappingProxyType as M
>>> from app.scheduler.snapshot import NodeState, Snapshot
>>> snap = Snapshot(M({"a": NodeState("a", weight=0.9, features_ts=5.0, correction=M({"gCTF": 2.0})),
...                    "b": NodeState("b", running=M({"gCTF": 3}))}), M({}), built_at=6.0, data_ts=5.0)
>>> t = table_of(snap, "gCTF")
>>> t.positions(["b", "x", "a"]).tolist(), t.correction.tolist(), t.running_of("gCTF").tolist()
([1, -1, 0], [2.0, 1.0], [0.0, 3.0])
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from app.scheduler.snapshot import ModelEntry, NodeState, Snapshot


class NodeTable:
    """Columns of a snapshot's nodes for one app (see the module docstring)."""

    def __init__(self, nodes: Mapping[str, NodeState], routes: Mapping[str, ModelEntry], app: str) -> None:
        states = list(nodes.values())
        n = len(states)
        self.names = tuple(st.name for st in states)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.weight = np.array([math.nan if st.weight is None else st.weight for st in states], dtype=np.float64)
        self.features_ts = np.array([st.features_ts for st in states], dtype=np.float64)
        self.weights_stale = np.array([st.weights_stale for st in states], dtype=bool)
        self.running_ts = np.array([st.running_ts for st in states], dtype=np.float64)
        self.predicted = np.array([st.predicted_rtt_ms.get(app, math.nan) for st in states], dtype=np.float64)
        corr = [st.correction.get(app, 1.0) for st in states]
        self.correction = np.array([c if c > 0 else 1.0 for c in corr], dtype=np.float64)
        self.samples = np.array([st.samples.get(app, 0) for st in states], dtype=np.int64)
        self.entries: list[ModelEntry] = []
        self.entry_of = np.full(n, -1, dtype=np.int64)
        self.row_of = np.zeros(n, dtype=np.int64)
        ids: dict[str, int] = {}
        for i, st in enumerate(states):
            entry = routes.get(st.name)
            if entry is None:
                continue
            k = ids.get(entry.key)
            if k is None:
                k = ids[entry.key] = len(self.entries)
                self.entries.append(entry)
            self.entry_of[i] = k
            self.row_of[i] = entry.row_index[st.name]
        self.running_apps = tuple(sorted({a for st in states for a in st.running}))
        self._running = np.zeros((n, len(self.running_apps)), dtype=np.float64)
        col = {a: j for j, a in enumerate(self.running_apps)}
        for i, st in enumerate(states):
            for a, c in st.running.items():
                self._running[i, col[a]] = c

    def positions(self, nodes: Sequence[str]) -> np.ndarray:
        """Row of each of ``nodes`` in this table (-1: unknown node)."""
        get = self.index.get
        return np.fromiter((get(name, -1) for name in nodes), dtype=np.int64, count=len(nodes))

    def running_of(self, app: str) -> np.ndarray:
        """The running-apps view's pods of ``app`` per node (0 where none)."""
        if app not in self.running_apps:
            return np.zeros(len(self.names))
        return self._running[:, self.running_apps.index(app)]


def table_of(snapshot: Snapshot, app: str) -> NodeTable:
    """The snapshot's :class:`NodeTable` for ``app``, built on first use and kept with the snapshot."""
    table = snapshot._tables.get(app)
    if isinstance(table, NodeTable):
        return table
    built = NodeTable(snapshot.nodes, snapshot.routes(app), app)
    if len(snapshot._tables) < 256:  # app labels are unbounded input
        snapshot._tables[app] = built
    return built
