"""A load-watcher-like collector: what Trimaran's scoring plugins read about a node's live load.

Upstream: ``paypal/load-watcher`` fetches, for every node, ``avg_over_time`` and ``stddev_over_time`` of
CPU and memory utilisation over a 15-minute window (``pkg/watcher/watcher.go``: ``FifteenMinutes``, one
fetch a minute; Prometheus rules ``instance:node_cpu:ratio`` and ``instance:node_memory_utilisation:ratio``),
and Trimaran's collector polls the watcher every 30 s (``pkg/trimaran/collector.go``:
``metricsUpdateIntervalSeconds``). A plugin scores from the last polled snapshot; a node absent from it
(no data yet, e.g. just joined) gets no metrics.

The three timings are options of the watcher and of both plugins, upstream's the defaults. The shipped
scenarios last 21-300 simulated seconds, so at upstream's timing a plugin scores a whole run from one to six
fetches, the first of the idle cluster; ``load_aware_tuned`` and ``target_load_tuned`` run them scaled to
that time scale (:data:`app.sim.policies.load_aware.TUNED`).

Here the samples are the simulator's scrapes (CPU utilisation ``1 - cpu_idle``, memory
``memory_used_fraction``); the snapshot at time ``t`` is the watcher's fetch at
``floor(floor(t / refresh_s) * refresh_s / fetch_s) * fetch_s`` over the preceding ``window_s``.

>>> w = LoadWatcher(fetch_s=60.0, refresh_s=30.0, window_s=900.0)
>>> for t in range(1, 100):
...     w.observe("n", float(t), cpu=0.2 if t % 2 else 0.4, mem=0.5)
>>> w.stats("n", 59.0) is None
True
>>> s = w.stats("n", 61.0); round(s.cpu_avg, 9), round(s.cpu_std, 9), s.mem_avg, s.window_end
(0.3, 0.1, 0.5, 60.0)
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque

import numpy as np

FETCH_S = 60.0  # load-watcher: one fetch a minute
REFRESH_S = 30.0  # Trimaran collector: metricsUpdateIntervalSeconds
WINDOW_S = 900.0  # load-watcher: 15-minute window


@dataclasses.dataclass(frozen=True)
class NodeStats:
    """Utilisation fractions (0..1) over the window, and when the window ended (simulated seconds)."""

    cpu_avg: float
    cpu_std: float
    mem_avg: float
    mem_std: float
    window_end: float


class LoadWatcher:
    def __init__(self, fetch_s: float = FETCH_S, refresh_s: float = REFRESH_S, window_s: float = WINDOW_S) -> None:
        for name, v in (("fetch_s", fetch_s), ("refresh_s", refresh_s), ("window_s", window_s)):
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"LoadWatcher.{name}: must be > 0 (got {v})")
        self.fetch_s = fetch_s
        self.refresh_s = refresh_s
        self.window_s = window_s
        self._samples: dict[str, deque[tuple[float, float, float]]] = {}
        self._snapshot: dict[str, NodeStats] = {}
        self._fetched_at: float | None = None

    def observe(self, node: str, t: float, cpu: float, mem: float) -> None:
        """One scrape of ``node`` at simulated time ``t`` (utilisation fractions)."""
        self._samples.setdefault(node, deque()).append((t, cpu, mem))

    def _fetch(self, at: float) -> None:
        snap: dict[str, NodeStats] = {}
        for node, q in self._samples.items():
            while q and q[0][0] <= at - self.window_s:
                q.popleft()
            rows = [s for s in q if s[0] <= at]
            if rows:
                a = np.array(rows)
                snap[node] = NodeStats(float(a[:, 1].mean()), float(a[:, 1].std()), float(a[:, 2].mean()),
                                       float(a[:, 2].std()), at)
        self._snapshot = snap
        self._fetched_at = at

    def snapshot_at(self, now: float) -> float:
        """When the watcher fetched the snapshot the plugin holds at ``now`` (it changes at most once a fetch)."""
        polled = math.floor(now / self.refresh_s) * self.refresh_s
        return math.floor(polled / self.fetch_s) * self.fetch_s

    def stats(self, node: str, now: float) -> NodeStats | None:
        """What the plugin reads for ``node`` at ``now`` (None: no metrics for it)."""
        fetch = self.snapshot_at(now)
        if self._fetched_at != fetch:
            self._fetch(fetch)
        return self._snapshot.get(node)
