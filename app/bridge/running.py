"""The running-pods view, as the bridge's GPU hang check reads it: pods of GPU apps per node.

``rttsched pods`` keeps ``rttsched:{prefix}running:{node} = {"apps": {...}, "started": {app: count}, ...}``
in Redis (:mod:`app.extender.podwatch`); its keys expire when the watcher stops. The bridge reads
``started``: pods running and not terminating. ``apps`` also counts pods still pulling their image and
pods shutting down, which do no GPU work, so a flat GPU under them is no hang. A value without
``started`` (written by an older watcher, whose ``apps`` counted only started pods) is read from ``apps``.
:class:`RunningPods` re-reads the view every ``refresh_s`` in the background, so a scrape round never
waits on Redis. ``gpu_pods(node)`` is the count of started pods whose app is one of ``gpu_apps`` (all apps
when that is empty); 0 for a node absent from a fresh view; None while there is no fresh view (never read,
or the last good read is older than ``3 x refresh_s``) -- then the check falls back to the exporters'
activity counts alone. Redis errors are counted, logged once until the next good read, and never raise;
a value that is not a running-apps value is skipped.

>>> class FakeRedis:
...     async def mget(self, keys): return [b'{"apps": {"gCTF": 3, "upload": 1}, "started": {"gCTF": 2}, "ts": 1.0}']
...     async def scan_iter(self, match, count):
...         yield b"rttsched:running:gpu-1"
>>> import asyncio
>>> from app.scheduler.cache import CacheKeys
>>> view = RunningPods(FakeRedis(), CacheKeys(), gpu_apps=("gCTF", "Motioncor2"), refresh_s=5.0, now=lambda: 0.0)
>>> asyncio.run(view.refresh())
True
>>> view.gpu_pods("gpu-1"), view.gpu_pods("gpu-2")
(2, 0)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from app.scheduler.cache import CacheKeys, load_running

log = logging.getLogger(__name__)

STALE_AFTER_REFRESHES = 3


class RunningPods:
    """Pods of GPU apps per node from the running-pods view in Redis, refreshed every ``refresh_s``."""

    def __init__(self, client: Any, keys: CacheKeys, *, gpu_apps: Collection[str] = (), refresh_s: float = 5.0,
                 now: Callable[[], float] = time.monotonic) -> None:
        if refresh_s <= 0:
            raise ValueError(f"refresh_s: must be > 0 (got {refresh_s})")
        self._client = client
        self._keys = keys
        self.gpu_apps = frozenset(gpu_apps)
        self.refresh_s = refresh_s
        self._now = now
        self._view: dict[str, int] = {}
        self._read_at: float | None = None
        self._failing = False
        self.failures = 0

    async def refresh(self) -> bool:
        """One read of the view; False (logged once until the next good read) when Redis failed."""
        try:
            running = await load_running(self._client, self._keys, started=True)
        except Exception as exc:  # noqa: BLE001 - any client error: keep the last view, count, go on
            self.failures += 1
            if not self._failing:
                log.warning("running-pods view unreadable from Redis, GPU hang check by exporters only: %s", exc)
            self._failing = True
            return False
        if self._failing:
            log.info("running-pods view readable again (%d nodes)", len(running))
        self._failing = False
        self._view = {node: sum(n for app, n in apps.items() if not self.gpu_apps or app in self.gpu_apps)
                      for node, apps in running.items()}
        self._read_at = self._now()
        return True

    def gpu_pods(self, node: str) -> int | None:
        """Started pods of GPU apps on ``node``; None while there is no fresh view."""
        if self._read_at is None or self._now() - self._read_at > STALE_AFTER_REFRESHES * self.refresh_s:
            return None
        return self._view.get(node, 0)

    async def run(self, delay: bool = False) -> None:
        """Refresh forever, every ``refresh_s`` (first after one period when ``delay``); cancel to stop."""
        while True:
            if delay:
                await asyncio.sleep(self.refresh_s)
            await self.refresh()
            delay = True
