"""Per-node windowed running aggregates over event time, in bounded memory.

A :class:`NodeWindow` keeps, for each time bucket (``bucket_s``, 1 s by default) and each metric, the
running statistics ``count, mean, m2, min, max, last, last_ts`` (Welford's update inside a bucket,
Chan's merge across buckets: the sum-of-squares form loses every digit on byte counters of 1e9 with a
small spread). Buckets live in a ring that covers ``history_s``: memory is
``7 x n_buckets x n_metrics`` floats whatever the event rate, and raw events are never stored.

Event time is the message ``ts``: an event lands in its own bucket, so out-of-order events inside the
history are counted where they belong; an event older than the ring is dropped (``update`` returns
False and ``late_dropped`` counts it). A window is a whole number of buckets ending with the bucket of
``until_ts``: :meth:`NodeWindow.aggregate` answers both "now, over the node's window" and "over the
window before a task started" (any ``until_ts`` still inside the history).

>>> w = NodeWindow(window_s=3.0, history_s=10.0)
>>> for t, u in [(100.2, 10.0), (101.5, 30.0), (100.7, 20.0), (103.1, 50.0)]:
...     _ = w.update(t, {"gpu_util": u})
>>> a = w.aggregate(until_ts=102.9)            # buckets 100, 101, 102
>>> a.count, a.stat("gpu_util", "mean"), a.stat("gpu_util", "last"), round(a.stat("gpu_util", "std"), 4)
(3, 20.0, 30.0, 8.165)
>>> w.aggregate().features()["gpu_util__max"]  # now: buckets 101..103
50.0
>>> w.update(80.0, {"gpu_util": 1.0}), w.late_dropped   # older than the 10 s history
(False, 1)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import numpy as np

from app.features.vector import AGGREGATES, feature_name

# rows of the state cube
STATS = ("count", "mean", "m2", "min", "max", "last", "last_ts")
N_STATS = len(STATS)
_EMPTY = np.array([0.0, 0.0, 0.0, np.inf, -np.inf, 0.0, -np.inf])
_COLS_CACHE_MAX = 32
_AGGS_CACHE_MAX = 64


@functools.lru_cache(maxsize=4096)
def _feature_names(metrics: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(feature_name(m, agg) for agg in AGGREGATES for m in metrics)


class WindowAggregate:
    """The merged statistics of the metrics seen in one window (metrics never seen there are absent).

    ``n, mean, std, min, max, last`` are arrays aligned with ``names``; ``std`` is the population
    standard deviation (0 for a single sample). ``count`` is the number of snapshots in the window.
    """

    __slots__ = ("_features", "count", "end_ts", "last", "max", "mean", "min", "n", "names", "start_ts", "std")

    def __init__(self, names: list[str], count: int, start_ts: float, end_ts: float, stats: np.ndarray) -> None:
        self.names = names
        self.count = count
        self.start_ts = start_ts
        self.end_ts = end_ts
        self.n, self.mean, self.std, self.min, self.max, self.last = stats
        self._features: dict[str, float] | None = None

    @classmethod
    def merge(cls, cube: np.ndarray, names: list[str], count: int, start_ts: float,
              end_ts: float) -> WindowAggregate:
        """Chan's merge of per-bucket statistics ``cube[stat, bucket, metric]`` over the buckets."""
        n_b = cube[0]
        n = n_b.sum(axis=0)
        seen = n > 0
        if not seen.all():
            names = [nm for nm, s in zip(names, seen, strict=True) if s]
            cube, n_b, n = cube[:, :, seen], n_b[:, seen], n[seen]
        if not len(names):
            return cls([], count, start_ts, end_ts, np.zeros((6, 0)))
        mean = (n_b * cube[1]).sum(axis=0) / n
        m2 = cube[2].sum(axis=0) + (n_b * (cube[1] - mean) ** 2).sum(axis=0)
        std = np.sqrt(np.maximum(m2, 0.0) / n)
        last = cube[5][cube[6].argmax(axis=0), np.arange(len(names))]
        stats = np.stack([n, mean, std, cube[3].min(axis=0), cube[4].max(axis=0), last])
        return cls(names, count, start_ts, end_ts, stats)

    def stat(self, metric: str, agg: str) -> float:
        """One aggregate (``n`` or one of :data:`~app.features.vector.AGGREGATES`) of one metric."""
        return float(getattr(self, agg)[self.names.index(metric)])

    def features(self) -> dict[str, float]:
        """``{metric}__{agg}`` for every metric seen in the window and every aggregate."""
        if self._features is None:
            names = _feature_names(tuple(self.names))
            values = np.concatenate([getattr(self, agg) for agg in AGGREGATES]).tolist()
            self._features = dict(zip(names, values, strict=True))
        return dict(self._features)


class NodeWindow:
    """Running aggregates of one node's metrics in event-time buckets.

    Parameters
    ----------
    window_s : float
        Default window of :meth:`aggregate` (DWA changes it with :meth:`set_window`).
    history_s : float
        How far back (from the newest event) buckets are kept; bounds memory and ``aggregate``.
    bucket_s : float
        Bucket width: the resolution of window edges.
    max_metrics : int
        Metrics beyond this many distinct names are ignored (``metrics_dropped`` counts them).
    """

    def __init__(self, window_s: float = 30.0, *, history_s: float = 120.0, bucket_s: float = 1.0,
                 max_metrics: int = 256) -> None:
        if not bucket_s > 0:
            raise ValueError(f"bucket_s must be > 0 (got {bucket_s})")
        if not history_s >= bucket_s:
            raise ValueError(f"history_s must be >= bucket_s (got {history_s} < {bucket_s})")
        if max_metrics < 1:
            raise ValueError(f"max_metrics must be >= 1 (got {max_metrics})")
        self.bucket_s = float(bucket_s)
        self.history_s = float(history_s)
        self.max_metrics = int(max_metrics)
        self.n_buckets = int(math.ceil(history_s / bucket_s)) + 1
        self.window_s = self._check_window(window_s)
        self.names: list[str] = []
        self._index: dict[str, int] = {}
        self._cols: dict[tuple[str, ...], slice | np.ndarray] = {}
        self._bucket = np.full(self.n_buckets, -1, dtype=np.int64)
        self._n = np.zeros(self.n_buckets)  # snapshots per bucket
        self._s = np.empty((N_STATS, self.n_buckets, 8))
        self._s[...] = _EMPTY[:, None, None]
        self.newest = -1
        self.late_dropped = 0
        self.metrics_dropped = 0
        self.dirty: set[int] = set()
        self._aggs: dict[tuple[int, int], WindowAggregate] = {}  # aggregates since the last change, by buckets

    def _check_window(self, window_s: float) -> float:
        if not 0 < window_s <= self.history_s:
            raise ValueError(f"window_s must be in (0, history_s={self.history_s}] (got {window_s})")
        return float(window_s)

    def set_window(self, window_s: float) -> None:
        self.window_s = self._check_window(window_s)

    @property
    def nbytes(self) -> int:
        """Memory held by the bucket arrays (bounded by history, bucket width and metric count)."""
        return int(self._s.nbytes + self._bucket.nbytes + self._n.nbytes)

    def newest_ts(self) -> float | None:
        """Time of the newest event held (None if empty)."""
        held = self._bucket > self.newest - self.n_buckets
        if self.newest < 0 or not held.any() or not self.names:
            return None
        return float(self._s[6, held, : len(self.names)].max())

    def held_slots(self) -> np.ndarray:
        """Ring slots holding a bucket of the history (what a changelog of the window must have)."""
        if self.newest < 0:
            return np.empty(0, dtype=np.int64)
        return np.flatnonzero((self._bucket >= 0) & (self._bucket > self.newest - self.n_buckets))

    def bucket_of(self, ts: float) -> int:
        return math.floor(ts / self.bucket_s)

    # -- ingest ----------------------------------------------------------------------------------
    def _columns(self, names: tuple[str, ...]) -> slice | np.ndarray | None:
        cols = self._cols.get(names)
        if cols is not None:
            return cols
        idx = []
        for name in names:
            j = self._index.get(name)
            if j is None:
                if len(self.names) >= self.max_metrics:
                    return None
                j = self._add_metric(name)
            idx.append(j)
        arr = np.array(idx, dtype=np.intp)
        contiguous = bool(len(arr)) and bool(np.all(np.diff(arr) == 1))
        cols = slice(int(arr[0]), int(arr[-1]) + 1) if contiguous else arr
        if len(self._cols) >= _COLS_CACHE_MAX:
            self._cols.clear()
        self._cols[names] = cols
        return cols

    def _add_metric(self, name: str) -> int:
        j = len(self.names)
        if j >= self._s.shape[2]:
            grown = np.empty((N_STATS, self.n_buckets, min(self.max_metrics, 2 * self._s.shape[2])))
            grown[...] = _EMPTY[:, None, None]
            grown[:, :, :j] = self._s
            self._s = grown
        self.names.append(name)
        self._index[name] = j
        self._aggs.clear()
        return j

    def update(self, ts: float, metrics: Mapping[str, float]) -> bool:
        """Add one snapshot taken at ``ts``; False (and counted) if it is older than the history."""
        k = self.bucket_of(ts)
        if k <= self.newest - self.n_buckets:
            self.late_dropped += 1
            return False
        names = tuple(metrics)
        cols = self._columns(names)
        if cols is None:  # a new name beyond max_metrics: keep the known ones
            known = {n: v for n, v in metrics.items() if n in self._index}
            self.metrics_dropped += len(metrics) - len(known)
            names = tuple(known)
            metrics = known
            cols = self._columns(names) if names else slice(0, 0)
            assert cols is not None
        if k > self.newest:
            self.newest = k
        slot = k % self.n_buckets
        if self._bucket[slot] != k:
            self._bucket[slot] = k
            self._n[slot] = 0.0
            self._s[:, slot, :] = _EMPTY[:, None]
        self._n[slot] += 1.0
        self.dirty.add(slot)
        self._aggs.clear()
        vals = np.fromiter(metrics.values(), dtype=np.float64, count=len(names))
        row = self._s[:, slot, :]
        c = row[0, cols] + 1.0
        mean = row[1, cols]
        delta = vals - mean
        mean = mean + delta / c
        row[2, cols] += delta * (vals - mean)
        row[1, cols] = mean
        row[0, cols] = c
        row[3, cols] = np.minimum(row[3, cols], vals)
        row[4, cols] = np.maximum(row[4, cols], vals)
        newer = row[6, cols] <= ts
        if newer.all():
            row[5, cols] = vals
            row[6, cols] = ts
        else:
            row[5, cols] = np.where(newer, vals, row[5, cols])
            row[6, cols] = np.where(newer, ts, row[6, cols])
        return True

    # -- query -----------------------------------------------------------------------------------
    def aggregate(self, until_ts: float | None = None, window_s: float | None = None) -> WindowAggregate:
        """Aggregates over the ``window_s`` (default: the node's window) ending with ``until_ts``'s bucket.

        Without ``until_ts`` the window ends with the newest bucket. Buckets older than the history are
        gone: such a window covers only what is left (``start_ts`` says where it really starts). Until the
        window next changes, asking again for the same buckets returns the same aggregate (read it, do not
        change it).
        """
        w = self.window_s if window_s is None else float(window_s)
        if not w > 0:
            raise ValueError(f"window_s must be > 0 (got {w})")
        hi = self.newest if until_ts is None else self.bucket_of(until_ts)
        lo = max(hi - max(1, round(w / self.bucket_s)) + 1, self.newest - self.n_buckets + 1)
        agg = self._aggs.get((lo, hi))
        if agg is not None:
            return agg
        m = len(self.names)
        sel = (self._bucket >= lo) & (self._bucket <= hi)
        cube = self._s[:, sel, :m]
        start = lo * self.bucket_s
        agg = WindowAggregate.merge(cube, list(self.names), int(self._n[sel].sum()), start, (hi + 1) * self.bucket_s)
        if len(self._aggs) >= _AGGS_CACHE_MAX:
            self._aggs.clear()
        self._aggs[lo, hi] = agg
        return agg

    # -- persistence (the bytes codec lives with the store) ------------------------------------------
    def take_dirty(self) -> list[int]:
        """Slots changed since the last call (to write to a changelog), oldest bucket first."""
        slots = sorted(self.dirty, key=lambda s: int(self._bucket[s]))
        self.dirty.clear()
        return slots

    def export_slot(self, slot: int) -> tuple[int, float, np.ndarray]:
        """``(bucket id, snapshots, stats[stat, metric])`` of one ring slot (a copy)."""
        return int(self._bucket[slot]), float(self._n[slot]), self._s[:, slot, : len(self.names)].copy()

    def load_slot(self, bucket: int, snapshots: float, stats: np.ndarray) -> bool:
        """Put back an exported slot (columns follow ``names``); False if it is older than the ring."""
        if stats.shape[0] != N_STATS or stats.shape[1] > len(self.names):
            raise ValueError(f"stats of shape {stats.shape} do not fit {len(self.names)} metrics")
        if bucket <= self.newest - self.n_buckets or bucket < 0:
            return False
        slot = bucket % self.n_buckets
        if int(self._bucket[slot]) > bucket:
            return False
        self.newest = max(self.newest, bucket)
        self._bucket[slot] = bucket
        self._n[slot] = snapshots
        self._aggs.clear()
        self._s[:, slot, :] = _EMPTY[:, None]
        self._s[:, slot, : stats.shape[1]] = stats
        return True

    def declare_metrics(self, names: list[str]) -> None:
        """Add metric columns in this order (before :meth:`load_slot`); known names are kept."""
        for name in names:
            if name not in self._index and len(self.names) < self.max_metrics:
                self._add_metric(name)
        self._cols.clear()
