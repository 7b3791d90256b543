"""Per-node state of the node-features agent: the window, its metadata, and its changelog rows.

The in-memory :class:`~app.features.window.NodeWindow` is authoritative while the worker runs; what
survives a restart is written at emit time only, as rows of a changelogged table keyed
``b"{node}#{slot}"`` (one ring slot: bucket id, snapshot count and the 7 x metrics statistics) and
``b"{node}#meta"`` (metric column order, node class, GPU model, windows). Keying by ring slot keeps the
compacted changelog the size of the ring, with no tombstones. A node whose state is not in memory is
rebuilt from those rows on its first message (after a restart or a rebalance).

>>> s = NodeState.new("n1", 0, window_s=10.0, history_s=60.0)
>>> s.update({"node": "n1", "ts": 100.0, "node_class": "gpu", "gpu_model": "Tesla M40",
...           "metrics": {"gpu_util": 40.0}}, partition=0)
True
>>> rows = dict(s.take_rows())
>>> sorted(rows)
[b'n1#39', b'n1#meta']
>>> r = NodeState.restore("n1", 0, rows.get, window_s=10.0, history_s=60.0)
>>> r.features_value()["features"]["gpu_util__mean"], r.gpu_model
(40.0, 'Tesla M40')
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import orjson

from app.features.node_value import features_value
from app.features.window import N_STATS, NodeWindow

_ROW_HEADER = struct.Struct("<qdI")  # bucket id, snapshots, metric count
META = "meta"


def encode_row(bucket: int, snapshots: float, stats: np.ndarray) -> bytes:
    return _ROW_HEADER.pack(bucket, snapshots, stats.shape[1]) + np.ascontiguousarray(stats, "<f8").tobytes()


def decode_row(raw: bytes) -> tuple[int, float, np.ndarray]:
    bucket, snapshots, m = _ROW_HEADER.unpack_from(raw)
    stats = np.frombuffer(raw, dtype="<f8", offset=_ROW_HEADER.size, count=N_STATS * m).reshape(N_STATS, m)
    return int(bucket), float(snapshots), stats


def row_key(node: str, slot: int | str) -> bytes:
    return f"{node}#{slot}".encode()


def node_of_key(key: bytes | str) -> str:
    k = key.decode() if isinstance(key, bytes) else key
    return k.rpartition("#")[0]


class NodeState:
    """One node: its window, what the last snapshot said about it, and what is not yet emitted."""

    __slots__ = ("gpu_model", "last_emit", "meta_dirty", "newest_ts", "node", "node_class", "partition",
                 "pending", "stale", "window", "windows")

    def __init__(self, node: str, partition: int, window: NodeWindow) -> None:
        self.node = node
        self.partition = partition
        self.window = window
        self.node_class = "cpu"
        self.gpu_model: str | None = None
        self.stale: list[str] = []
        self.windows: dict[str, float] = {}
        self.newest_ts = 0.0
        self.pending = False
        self.meta_dirty = True
        self.last_emit = -float("inf")

    @classmethod
    def new(cls, node: str, partition: int, *, window_s: float, history_s: float, bucket_s: float = 1.0,
            max_metrics: int = 256) -> NodeState:
        w = NodeWindow(window_s, history_s=history_s, bucket_s=bucket_s, max_metrics=max_metrics)
        return cls(node, partition, w)

    @classmethod
    def restore(cls, node: str, partition: int, get: Callable[[bytes], bytes | None], **kw: Any) -> NodeState:
        """Rebuild from changelog rows (``get(key) -> value or None``); a fresh state if there are none."""
        s = cls.new(node, partition, **kw)
        meta_raw = get(row_key(node, META))
        if not meta_raw:
            return s
        meta = orjson.loads(meta_raw)
        s.node_class, s.gpu_model, s.stale = meta["node_class"], meta.get("gpu_model"), meta.get("stale", [])
        s.windows = dict(meta.get("windows", {}))
        if meta.get("window_s"):
            s.window.set_window(min(float(meta["window_s"]), s.window.history_s))
        s.window.declare_metrics(list(meta["names"]))
        for slot in range(s.window.n_buckets):
            raw = get(row_key(node, slot))
            if raw:
                s.window.load_slot(*decode_row(raw))
        s.window.dirty.clear()
        s.newest_ts = s.window.newest_ts() or 0.0
        s.meta_dirty = False
        return s

    def update(self, snap: dict[str, Any], partition: int) -> bool:
        """Fold one validated node-metrics value in; False if it was older than the history (dropped)."""
        names_before = len(self.window.names)
        ok = self.window.update(snap["ts"], snap["metrics"])
        if not ok:
            return False
        self.partition = partition
        if snap["ts"] > self.newest_ts:
            self.newest_ts = snap["ts"]
            cls, gpu, stale = snap["node_class"], snap.get("gpu_model"), snap.get("stale", [])
            if cls != self.node_class or gpu != self.gpu_model or stale != self.stale:
                self.node_class, self.gpu_model, self.stale = cls, gpu, stale
                self.meta_dirty = True
        if len(self.window.names) != names_before:
            self.meta_dirty = True
        self.pending = True
        return True

    def set_window(self, window_s: float, app: str | None = None) -> None:
        """The node's window (``app=None``) or one app's DWA window."""
        if app is None:
            self.window.set_window(window_s)
        else:
            self.windows[app] = float(window_s)
        self.meta_dirty = True

    def features_value(self, app_names: Mapping[str, Collection[str]] | None = None) -> dict[str, Any]:
        """The node-features value (contract ``topics/node-features.json``) of the node's current window, with
        the features each app's models read over the app's DWA window (:mod:`app.features.node_value`)."""
        return features_value(self.node, self.newest_ts, self.node_class, self.gpu_model, self.window, self.windows,
                              app_names, self.stale)

    def retake(self, keys: Iterable[bytes]) -> None:
        """Mark again the rows of ``keys`` (taken by a changelog write that did not store them)."""
        for key in keys:
            slot = key.decode().rsplit("#", 1)[1]
            if slot == META:
                self.meta_dirty = True
            else:
                self.window.dirty.add(int(slot))

    def rewrite(self) -> None:
        """Mark every row of the state changed: its meta and each slot of its history."""
        self.meta_dirty = True
        self.window.dirty.update(int(slot) for slot in self.window.held_slots())

    def take_rows(self) -> Iterator[tuple[bytes, bytes]]:
        """Changelog rows for what changed since the last call (slots, then meta if it changed)."""
        w = self.window
        for slot in w.take_dirty():
            yield row_key(self.node, slot), encode_row(*w.export_slot(slot))
        if self.meta_dirty:
            self.meta_dirty = False
            meta = {"names": w.names, "node_class": self.node_class, "gpu_model": self.gpu_model,
                    "stale": self.stale, "windows": self.windows, "window_s": w.window_s}
            yield row_key(self.node, META), orjson.dumps(meta)
