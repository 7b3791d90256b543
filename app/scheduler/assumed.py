"""Assumed pods: a just-placed pod counts against its node before the node's metrics can show it.

kube-scheduler does not tell an extender where it bound a pod. After ``prioritize`` the extender assumes the
pod lands on its top-scored node (:meth:`AssumedPods.assume`). The record then

* inflates predicted RTTs on that node (:meth:`AssumedPods.pending`) until a node-features message newer
  than ``placed_at + scrape_delay_s`` arrives — from then on the load is in the features themselves
  (within ``ttl_s``, whatever its expected end);
* counts for anti-affinity and as a running pod (:meth:`AssumedPods.on_node`, :meth:`AssumedPods.counts`)
  until it is expected to have finished: ``rtt_multiple`` times the RTT predicted for it on that node
  (:meth:`AssumedPods.expect`, noted by :func:`app.scheduler.decide.decide`), capped at ``ttl_s`` — the
  extender never sees completions, so the prediction is its best guess of when the pod ends;
* is forgotten after ``ttl_s`` whatever happens, or replaced when the same pod is scored again.

All methods take ``now`` explicitly (no clock inside), so the behaviour is deterministic under test.

>>> a = AssumedPods(ttl_s=60, scrape_delay_s=5)
>>> a.assume("uid-1", "Motioncor2", "gpu-1", now=100.0)
>>> [p.app for p in a.pending("gpu-1", features_ts=103.0, now=104.0)]
['Motioncor2']
>>> a.pending("gpu-1", features_ts=106.0, now=107.0)
()
>>> len(a.on_node("gpu-1", now=159.0)), len(a.on_node("gpu-1", now=161.0))
(1, 0)
>>> a.expect("uid-2", ("gpu-1", "gpu-2"), [4000.0, 9000.0])  # predicted 4 s on gpu-1
>>> a.assume("uid-2", "gCTF", "gpu-1", now=200.0)
>>> a.counts("gpu-1", now=205.0), a.counts("gpu-1", now=208.5)
({'gCTF': 1}, {})
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import KeysView, Sequence

EMPTY: tuple[AssumedPod, ...] = ()
MAX_APPS = 64
MAX_HINTS = 256  # notes of expected runs kept for the placement that follows them (each holds a node list)


@dataclasses.dataclass(frozen=True, slots=True)
class AssumedPod:
    task_id: str
    app: str
    node: str
    placed_at: float  # unix seconds
    until: float = math.inf  # unix seconds: expected to have finished (at most placed_at + ttl_s)
    input_mb: float = math.nan  # the pod's input size (``task_input_size_mb``; NaN: not annotated)

    def remaining(self, now: float) -> float:
        """The share of its expected run still ahead at ``now`` (0..1; 0.5 when no end is expected)."""
        span = self.until - self.placed_at
        if not (math.isfinite(span) and span > 0):
            return 0.5
        return min(1.0, max(0.0, (self.until - now) / span))


class AssumedPods:
    """Recently placed pods by node; bounded by ``max_pods`` (oldest dropped first).

    Parameters
    ----------
    ttl_s
        A placement counts for at most this long (seconds).
    scrape_delay_s
        Metrics need this long after a placement before node-features can reflect it.
    max_pods
        Upper bound on remembered placements.
    rtt_multiple
        A placement with a predicted RTT ends after ``rtt_multiple`` times that RTT (capped at ``ttl_s``).
    """

    def __init__(self, ttl_s: float = 120.0, scrape_delay_s: float = 5.0, max_pods: int = 100_000,
                 rtt_multiple: float = 1.5) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0 (got {ttl_s})")
        if scrape_delay_s < 0:
            raise ValueError(f"scrape_delay_s must be >= 0 (got {scrape_delay_s})")
        if max_pods < 1:
            raise ValueError(f"max_pods must be >= 1 (got {max_pods})")
        if not rtt_multiple > 0:
            raise ValueError(f"rtt_multiple must be > 0 (got {rtt_multiple})")
        self.rtt_multiple = float(rtt_multiple)
        self.ttl_s = float(ttl_s)
        self.scrape_delay_s = float(scrape_delay_s)
        self.max_pods = int(max_pods)
        self._reset()

    def _reset(self) -> None:
        self._by_task: dict[str, AssumedPod] = {}  # insertion order = placement order
        self._by_node: dict[str, dict[str, AssumedPod]] = {}
        self._hints: dict[str, tuple[Sequence[str], Sequence[float]]] = {}  # task -> (nodes, predicted ms)
        self._apps: dict[str, None] = {}  # apps ever placed, first seen first (at most MAX_APPS)

    def __len__(self) -> int:
        return len(self._by_task)

    @property
    def nodes(self) -> KeysView[str]:
        """Nodes with at least one remembered placement (a live, read-only view)."""
        return self._by_node.keys()

    @property
    def hinted(self) -> int:
        """Pods whose predicted RTTs were noted by :meth:`expect` and not yet used by :meth:`assume`."""
        return len(self._hints)

    @property
    def apps(self) -> tuple[str, ...]:
        """Apps of every placement so far (first seen first; bounded: app labels are unbounded input)."""
        return tuple(self._apps)

    def expect(self, task_id: str, nodes: Sequence[str], rtt_ms: Sequence[float]) -> None:
        """Note the RTT (ms; NaN: unknown) predicted for ``task_id`` on each of ``nodes``, for :meth:`assume`.

        A note is for the placement that follows in the same scheduling step (prioritize, then assume): at most
        :data:`MAX_HINTS` are kept, the oldest dropped first, and :meth:`unexpect` drops one no placement used.
        """
        self._hints.pop(task_id, None)
        while len(self._hints) >= MAX_HINTS:
            del self._hints[next(iter(self._hints))]
        self._hints[task_id] = (nodes, rtt_ms)

    def unexpect(self, task_id: str) -> None:
        """Drop what :meth:`expect` noted for ``task_id`` (the pod was placed nowhere the extender expected)."""
        self._hints.pop(task_id, None)

    def _until(self, task_id: str, node: str, now: float, expected_s: float | None) -> float:
        hint = self._hints.pop(task_id, None)
        if expected_s is None and hint is not None and node in hint[0]:
            expected_s = float(hint[1][list(hint[0]).index(node)]) / 1000.0
        if expected_s is not None and math.isfinite(expected_s) and expected_s > 0:
            return now + min(self.ttl_s, self.rtt_multiple * expected_s)
        return now + self.ttl_s

    def assume(self, task_id: str, app: str, node: str, now: float, expected_s: float | None = None,
               input_mb: float = math.nan) -> None:
        """Record that ``task_id`` (of ``app``, input ``input_mb``) was placed on ``node`` at ``now``; replaces an
        older record.

        ``expected_s``: its expected RTT in seconds; None takes the prediction noted by :meth:`expect`,
        and without one the placement counts for ``ttl_s``.
        """
        self.forget(task_id)
        self.expire(now)
        while len(self._by_task) >= self.max_pods:
            self.forget(next(iter(self._by_task)))
        if app not in self._apps and len(self._apps) < MAX_APPS:
            self._apps[app] = None
        pod = AssumedPod(task_id, app, node, float(now), self._until(task_id, node, float(now), expected_s),
                         float(input_mb))
        self._by_task[task_id] = pod
        self._by_node.setdefault(node, {})[task_id] = pod

    def forget(self, task_id: str) -> None:
        pod = self._by_task.pop(task_id, None)
        if pod is None:
            return
        on_node = self._by_node.get(pod.node)
        if on_node is not None:
            on_node.pop(task_id, None)
            if not on_node:
                del self._by_node[pod.node]

    def expire(self, now: float) -> int:
        """Drop placements older than the TTL; returns how many were dropped."""
        cutoff = now - self.ttl_s
        dropped = 0
        while self._by_task:  # placement order: stop at the first one still young (O(expired), no copy)
            task_id, pod = next(iter(self._by_task.items()))
            if pod.placed_at > cutoff:
                break
            self.forget(task_id)
            dropped += 1
        return dropped

    def scan(self, node: str, now: float, features_ts: float, exclude: str = "",
             since: float = -math.inf) -> tuple[dict[str, int], tuple[str, ...], tuple[AssumedPod, ...]]:
        """:meth:`counts` (with ``since``), the apps of :meth:`pending` and :meth:`on_node` (without ``since``)
        of ``node``, in one pass.

        >>> a = AssumedPods(ttl_s=60, scrape_delay_s=5)
        >>> a.assume("p1", "gCTF", "n", now=100.0); a.assume("p2", "upload", "n", now=90.0)
        >>> counts, pending, live = a.scan("n", now=101.0, features_ts=99.0, since=95.0)
        >>> counts, pending, [p.task_id for p in live]
        ({'gCTF': 1}, ('gCTF',), ['p1', 'p2'])
        """
        pods = self._by_node.get(node)
        counts: dict[str, int] = {}
        if not pods:
            return counts, (), EMPTY
        cutoff = now - self.ttl_s
        pending: list[str] = []
        live: list[AssumedPod] = []
        for p in pods.values():
            if p.placed_at <= cutoff or p.task_id == exclude:
                continue
            if p.until > now:
                live.append(p)
                if p.placed_at > since:
                    counts[p.app] = counts.get(p.app, 0) + 1
            if features_ts <= p.placed_at + self.scrape_delay_s:
                pending.append(p.app)
        return counts, tuple(pending), tuple(live)

    def on_node(self, node: str, now: float, exclude: str = "", since: float = -math.inf) -> tuple[AssumedPod, ...]:
        """Placements on ``node`` after ``since`` not expected to have finished by ``now``, without ``exclude``."""
        pods = self._by_node.get(node)
        if not pods:
            return EMPTY
        cutoff = max(now - self.ttl_s, since)
        return tuple(p for p in pods.values() if p.placed_at > cutoff and p.until > now and p.task_id != exclude)

    def counts(self, node: str, now: float, exclude: str = "", since: float = -math.inf) -> dict[str, int]:
        """Pods per app on ``node`` (:meth:`on_node`): the scheduler's view of what still runs there.

        ``since``: only placements after it (a running-apps view read then already shows the older ones).
        """
        out: dict[str, int] = {}
        for p in self.on_node(node, now, exclude, since):
            out[p.app] = out.get(p.app, 0) + 1
        return out

    def pending(self, node: str, features_ts: float, now: float, exclude: str = "") -> tuple[AssumedPod, ...]:
        """Placements on ``node`` that its latest features (taken at ``features_ts``) cannot show yet.

        Within ``ttl_s`` whatever their expected end: load the scrape has not seen yet still weighs on the
        node's metrics-based prediction even when the pod itself may be done.
        """
        pods = self._by_node.get(node)
        if not pods:
            return EMPTY
        cutoff = now - self.ttl_s
        return tuple(p for p in pods.values() if p.placed_at > cutoff and p.task_id != exclude
                     and features_ts <= p.placed_at + self.scrape_delay_s)
