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

from app.extender.model_retry import RUNNING_VIEW
from app.scheduler.builder import SnapshotBuilder
from app.scheduler.cache import CacheKeys, load_running, load_view

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

    ``now``: the clock the view is stamped with when read (assumed pods placed before it, less the scrape
    delay, are then left to the view); None leaves the view unstamped.
    """

    def __init__(
        self, client: Any, keys: CacheKeys, builder: SnapshotBuilder, period_s: float,
        on_change: Callable[[], object] | None = None, now: Callable[[], float] | None = None,
        degraded: Any = None,
    ) -> None:
        self._client = client
        self._degraded = degraded  # model_retry.Degraded: a failing refresh is reported (/readyz, gauge) once
        self._now = now
        self._on_change = on_change
        self._keys = keys
        self._builder = builder
        self._period = period_s
        self._known: set[str] = set()

    async def refresh(self) -> int:
        """One refresh; returns the number of nodes with a running-apps entry."""
        running = await load_running(self._client, self._keys)
        ts = self._now() if self._now is not None else None
        for node in self._known - set(running):
            self._builder.apply_running(node, {}, ts)
        for node, apps in running.items():
            self._builder.apply_running(node, apps, ts)
        self._known = set(running)
        return len(running)

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
