"""Assumed pods: a just-placed pod counts against its node before the node's metrics can show it.

kube-scheduler does not tell an extender where it bound a pod. After ``prioritize`` the extender assumes the
pod lands on its top-scored node (:meth:`AssumedPods.assume`). The record then

* inflates predicted RTTs on that node (:meth:`AssumedPods.pending`) until a node-features message newer
  than ``placed_at + scrape_delay_s`` arrives — from then on the load is in the features themselves;
* counts for anti-affinity (:meth:`AssumedPods.on_node`) until ``ttl_s`` has passed;
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
"""

from __future__ import annotations

import dataclasses

EMPTY: tuple[AssumedPod, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class AssumedPod:
    task_id: str
    app: str
    node: str
    placed_at: float  # unix seconds


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
    """

    def __init__(self, ttl_s: float = 120.0, scrape_delay_s: float = 5.0, max_pods: int = 100_000) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0 (got {ttl_s})")
        if scrape_delay_s < 0:
            raise ValueError(f"scrape_delay_s must be >= 0 (got {scrape_delay_s})")
        if max_pods < 1:
            raise ValueError(f"max_pods must be >= 1 (got {max_pods})")
        self.ttl_s = float(ttl_s)
        self.scrape_delay_s = float(scrape_delay_s)
        self.max_pods = int(max_pods)
        self._reset()

    def _reset(self) -> None:
        self._by_task: dict[str, AssumedPod] = {}  # insertion order = placement order
        self._by_node: dict[str, dict[str, AssumedPod]] = {}

    def __len__(self) -> int:
        return len(self._by_task)

    def assume(self, task_id: str, app: str, node: str, now: float) -> None:
        """Record that ``task_id`` (of ``app``) was placed on ``node`` at ``now``; replaces an older record."""
        self.forget(task_id)
        self.expire(now)
        while len(self._by_task) >= self.max_pods:
            self.forget(next(iter(self._by_task)))
        pod = AssumedPod(task_id, app, node, float(now))
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

    def on_node(self, node: str, now: float, exclude: str = "") -> tuple[AssumedPod, ...]:
        """Placements on ``node`` still within the TTL (for anti-affinity), without ``exclude``."""
        pods = self._by_node.get(node)
        if not pods:
            return EMPTY
        cutoff = now - self.ttl_s
        return tuple(p for p in pods.values() if p.placed_at > cutoff and p.task_id != exclude)

    def pending(self, node: str, features_ts: float, now: float, exclude: str = "") -> tuple[AssumedPod, ...]:
        """Placements on ``node`` that its latest features (taken at ``features_ts``) cannot show yet."""
        pods = self.on_node(node, now, exclude)
        if not pods:
            return EMPTY
        return tuple(p for p in pods if features_ts <= p.placed_at + self.scrape_delay_s)
