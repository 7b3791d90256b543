"""Warm start and running-apps refresh from Redis (key layout: :mod:`app.scheduler.cache`).

A restarted extender applies the cached latest node-features, node-weights, running apps and models, builds
its first snapshot and is ready — usually in well under a second — while the Kafka feed catches up behind it
(older messages never overwrite newer cached values: the builder only moves forward in ts and version).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from app.extender.model_retry import PODS_VIEW_STALE, RUNNING_VIEW
from app.scheduler.builder import SnapshotBuilder
from app.scheduler.cache import CacheKeys, load_running_view, load_view

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class WarmResult:
    nodes: int
    models: int
    rejected: int
    seconds: float

    @property
    def usable(self) -> bool:
        """Whether the cache held a view worth serving (at least one node)."""
        return self.nodes > 0


async def warm_start(
    client: Any, keys: CacheKeys, builder: SnapshotBuilder,
    load_model: Callable[[Mapping[str, Any]], Awaitable[bool]],
) -> WarmResult:
    """Apply everything cached under ``keys`` to ``builder``; models load concurrently via ``load_model``."""
    t0 = time.monotonic()
    view = await load_view(client, keys)
    for value in view.features:
        builder.apply_node_features(value)
    for value in view.weights:
        builder.apply_node_weights(value)
    for node, apps in view.running.items():
        builder.apply_running(node, apps)
    loaded = await asyncio.gather(*(load_model(u) for u in view.model_updates))
    result = WarmResult(builder.node_count, sum(loaded), view.rejected, time.monotonic() - t0)
    log.info("warm start from redis: %d nodes, %d models in %.3fs (%d rejected)",
             result.nodes, result.models, result.seconds, result.rejected)
    return result


class RunningRefresher:
    """Re-read the running-apps view from Redis every ``period_s`` and apply changes to the builder.

    ``now``: the clock the view is stamped with (assumed pods placed before the stamp, less the scrape delay,
    are left to the view); None leaves the view unstamped. Each value carries ``ts``, when the pods watcher last
    confirmed it; a healthy watcher renews every value each ``RTT_PODS_RESYNC_S``. A value confirmed within
    ``stale_after_s`` is current: stamped with the read time. An older one is **stale** — the watcher stopped,
    or cannot reach the API — and is stamped with its own ``ts``, so the extender's placements since then keep
    counting. A node whose value vanished (its pods gone, or its key expired) is stamped with the read time
    only while another value is current (the watcher renews all together); otherwise its stamp stays.

    While the values read are all stale, ``degraded`` holds the reason ``pods_view_stale`` with the time of the
    last confirmation; a current value clears it. An empty view changes nothing: a cluster without our pods
    has no values, just as one whose watcher stopped long ago.
    """

    def __init__(
        self, client: Any, keys: CacheKeys, builder: SnapshotBuilder, period_s: float,
        on_change: Callable[[], object] | None = None, now: Callable[[], float] | None = None,
        degraded: Any = None, stale_after_s: float = 60.0,
    ) -> None:
        self._client = client
        self._degraded = degraded  # model_retry.Degraded: a failing refresh is reported (/readyz, gauge) once
        self._now = now
        self._on_change = on_change
        self._keys = keys
        self._builder = builder
        self._period = period_s
        self.stale_after_s = stale_after_s  # 2 x RTT_PODS_RESYNC_S (ExtenderOptions.running_stale_s)
        self._known: set[str] = set()
        self.stale_since: float | None = None  # the last confirmation of a view found stale; None: current

    async def refresh(self) -> int:
        """One refresh; returns the number of nodes with a running-apps entry."""
        view = await load_running_view(self._client, self._keys)
        running = view.running
        now = self._now() if self._now is not None else None
        # values confirmed longer ago than allowed -> their ts (a value without ts is taken as current)
        stale = {} if now is None else {
            node: ts for node, ts in view.running_ts.items() if now - ts > self.stale_after_s}
        current = len(stale) < len(running)
        for node in self._known - set(running):
            self._builder.apply_running(node, {}, now if current else None)
        for node, apps in running.items():
            if node in stale:
                self._builder.apply_running(node, apps, stale[node], rewind=True)
            else:
                self._builder.apply_running(node, apps, now)
        self._known = set(running)
        if running and now is not None:
            self._report(None if current else max(stale.values()))
        return len(running)

    def _report(self, stale_since: float | None) -> None:
        was, self.stale_since = self.stale_since, stale_since
        if stale_since is None:
            if was is not None:
                if self._degraded is not None:
                    self._degraded.done(PODS_VIEW_STALE, "pods-watcher")
                else:
                    log.info("running-apps view current again")
            return
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stale_since))
        detail = (f"pods view stale: not confirmed by the pods watcher since {when} (allowed: "
                  f"{self.stale_after_s:g} s); the extender counts its own placements made since then")
        if self._degraded is not None:
            self._degraded.waiting(PODS_VIEW_STALE, "pods-watcher", detail)
        elif was != stale_since:
            log.warning("%s", detail)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._period)
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: the last view stays; said once, not every period
                if self._degraded is not None:
                    self._degraded.waiting(RUNNING_VIEW, "refresh", f"running-apps refresh from redis failed: {exc}")
                else:
                    log.warning("running-apps refresh from redis failed: %s", exc)
                continue
            if self._degraded is not None:
                self._degraded.done(RUNNING_VIEW, "refresh")
            if self._builder.dirty and self._on_change is not None:
                self._on_change()
