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
    are left to the view); None leaves the view unstamped. How current the view is, is judged on this clock
    alone: the pods watcher's times (its heartbeat ``running-sync``, written at each list and renewal, and
    each value's ``ts``) come from another machine's clock and are only compared with each other. The newest
    of them is the watcher's last confirmation; the refresher notes the local time it last saw that advance
    (a new heartbeat, or a newer time; a value without ``ts`` counts as confirmed at each read). Before any
    advance, the first read's time stands in for one: a view already stale at start is reported
    ``stale_after_s`` later. Until a heartbeat or a value has been read at all there is no view to judge (no
    pods watcher runs, as in docker-compose): it is current. A watcher that never wrote a heartbeat (of an older
    release) confirms only through its values' ``ts``, so its view is judged only while it holds a value: with
    none of our pods running it has nothing to renew.

    The view is **current** while it advanced within ``stale_after_s`` of the read: every node is stamped with
    the read time, a node whose value vanished too (the watcher deleted its key: nothing of ours runs there),
    also when no value is left. Otherwise it is **stale** — the watcher stopped, or cannot reach the API or
    Redis — and every node's stamp, nodes emptied since the last advance included, goes back to the time of
    the last advance less one period (the watcher confirmed at most that long before it was read), so the
    extender's placements since then count again; ``degraded`` holds the reason ``pods_view_stale`` with that
    time until the view advances again, and a node left empty meanwhile is empty as of the read that sees it.
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
        self._known: set[str] = set()  # nodes with a value at the last read
        self._emptied: set[str] = set()  # nodes without a value stamped by a current read since the last advance
        self._rewound: set[str] = set()  # nodes without a value rewound by a stale read
        self._confirmed: float | None = None  # the newest confirmation read (the watcher's clock)
        self._heartbeat: float | None = None  # the last heartbeat read (the watcher's clock)
        self.advanced_at: float | None = None  # local time the confirmation last advanced (None: not read yet)
        self._seen = False  # a heartbeat or a value was ever read (without: no watcher, nothing to judge)
        self.stale_since: float | None = None  # the stamp of a view found stale (local clock); None: current

    async def refresh(self) -> int:
        """One refresh; returns the number of nodes with a running-apps entry."""
        view = await load_running_view(self._client, self._keys)
        running = view.running
        now = stamp = self._now() if self._now is not None else None
        stale = False
        if now is not None:
            advanced_at = self._note(view.running_sync, max(view.running_ts.values(), default=None),
                                     len(view.running_ts) < len(running), now)
            if self._seen and now - advanced_at > self.stale_after_s and (self._heartbeat is not None or running):
                stamp, stale = advanced_at - self._period, True
        vanished = self._known - set(running)
        if stale:  # emptied since the last advance: not confirmed empty either
            vanished = self._rewound = (self._rewound | self._emptied | vanished) - set(running)
            self._emptied = set()
        elif now is not None:  # a node rewound empty while stale is empty as of this read too
            vanished = (vanished | self._rewound) - set(running)
            self._emptied, self._rewound = self._emptied | vanished, set()
        for node in vanished:
            self._builder.apply_running(node, {}, stamp, rewind=stale)
        for node, apps in running.items():
            self._builder.apply_running(node, apps, stamp, rewind=stale)
        self._known = set(running)
        if now is not None:
            self._report(stamp if stale else None)
        return len(running)

    def _note(self, heartbeat: float | None, newest: float | None, untimed: bool, now: float) -> float:
        """``advanced_at``, moved to ``now`` when the watcher confirmed the view since the last read (``newest``:
        the newest value's ``ts``; ``untimed``: a value without one was read)."""
        advanced = self.advanced_at is None or untimed  # the first read stands in for an advance
        self._seen = self._seen or untimed or heartbeat is not None or newest is not None
        if heartbeat is not None and heartbeat != self._heartbeat:  # a new heartbeat, even from a clock set back
            advanced, self._heartbeat = True, heartbeat
        latest = max((t for t in (heartbeat, newest) if t is not None), default=None)
        if latest is not None and (self._confirmed is None or latest > self._confirmed):
            advanced, self._confirmed = True, latest
        if advanced or self.advanced_at is None:
            self.advanced_at = now
            self._emptied.clear()
        return self.advanced_at

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
        detail = (f"pods view stale: not confirmed by the pods watcher since {when} (the extender's clock; "
                  f"allowed: {self.stale_after_s:g} s); the extender counts its own placements made since then")
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
