"""The running-apps view writer: our pods from the Kubernetes API, counted per node and app, into Redis.

It follows the informer pattern as client-go's reflector does: one list, then a watch from the list's
resourceVersion, applying ADDED/MODIFIED/DELETED events as they arrive and resuming each watch request from
the last resourceVersion seen (BOOKMARKs included). It lists again only after a failure: a 410 Gone
(relisted at once), an ERROR event, or any API or Redis error (after the backoff). There is no periodic
relist: a list with ``limit`` is a quorum read from etcd, and the watch already delivers every change.
Each watch request asks the server to close it at the end of the resync period, ``resync_s``
(``RTT_PODS_RESYNC_S``), through ``timeoutSeconds``, and is read until the server does; each time it has,
every change up to then has arrived, so every key is written again from the pods held in memory, renewing
its TTL and its ``ts``. A watch accepted but silent confirms nothing: one the server has not closed the
request timeout after its ``timeoutSeconds`` (or never answered) is a ``timeout`` error, and the watcher
relists. With ``watch=False`` it only lists, every ``resync_s``. After each list or batch of events the
counts are compared with what was last written and only what changed is written, in one pipeline::

    rttsched:{prefix}running:{node} = {"apps": {app: count}, "started": {app: count}, "ts": unix seconds}
                                                                                            (PX ttl_s)
    rttsched:{prefix}running-sync   = {"ts": unix seconds}                                  (PX ttl_s)

``apps`` counts the pods the scheduler should count (bound, not finished; terminating ones until they
are gone), ``started`` those running and not terminating (:mod:`app.extender.podwatch_view`). ``ts`` is
when the API server last confirmed the value: written at each list, renewal or change. A node left without
any of our pods has its key deleted. Each list also deletes keys of nodes it does not know (left by an
earlier run), so the watcher owns every ``running:*`` key of its prefix. ``running-sync`` is the heartbeat:
written with every list and renewal, in the same pipeline, also when no node has any of our pods, so a reader
can tell an empty view the watcher confirms from one nobody confirms. The TTL is 3 x resync by default: the
view of a watcher that stopped — or has not confirmed it for 3 resyncs — expires instead of lying.

Errors never stop it: an API or Redis failure is counted by kind, logged once per kind until the next
success (repeats at debug) and retried with exponential backoff, waiting at least what the server asked
for in ``Retry-After``; a malformed pod is skipped and counted. The extender reads the view with
:func:`app.scheduler.cache.load_running`, the bridge with :mod:`app.bridge.running`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from redis.exceptions import RedisError

from app.config import a_day_at_most, check_flag, key_lifetime
from app.errors import ConfigError
from app.extender.podwatch_api import KubeApiError, PodsApi
from app.extender.podwatch_view import Placement, View, diff_views, encode_node, placement, tally
from app.scheduler.cache import CacheKeys, encode_running_sync
from app.scheduler.podinfo import PodError

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PodWatchOptions:
    """How often to renew keys (and list, without a watch), whether to watch, how long keys live, how to back off."""

    resync_s: float = 30.0
    watch: bool = True
    ttl_s: float = 0.0  # 0: 3 x resync_s
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0

    def __post_init__(self) -> None:
        # the checks of the settings (app.config), and bounds that keep the TTL in ms a number Redis takes
        check_flag("RTT_PODS_RESYNC_S", self.resync_s, a_day_at_most)
        check_flag("RTT_PODS_TTL_S", self.ttl_s, key_lifetime)
        if self.ttl_s and self.ttl_s < self.resync_s:
            raise ConfigError("RTT_PODS_TTL_S", f"must be >= RTT_PODS_RESYNC_S (got {self.ttl_s})")
        if not 0 < self.backoff_initial_s <= self.backoff_max_s:
            raise ConfigError("backoff_initial_s", "must be > 0 and <= backoff_max_s")

    @property
    def key_ttl_ms(self) -> int:
        return max(1, round(1000 * (self.ttl_s or 3 * self.resync_s)))

    def backoff_s(self, failures: int) -> float:
        """Wait after ``failures`` consecutive failures: doubling from the initial wait, capped.

        >>> [PodWatchOptions(backoff_initial_s=0.5, backoff_max_s=3).backoff_s(n) for n in (1, 2, 3, 4, 9)]
        [0.5, 1.0, 2.0, 3.0, 3.0]
        """
        return min(float(self.backoff_max_s), self.backoff_initial_s * 2 ** min(max(failures - 1, 0), 30))


class PodWatchMetrics:
    """``rtt_pods_*`` metrics of one watcher, in their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry(auto_describe=True)
        self.seen = Gauge("rtt_pods_seen", "Our pods counted on a node (bound, not finished) in the current view",
                          registry=r)
        self.started = Gauge("rtt_pods_started", "Our pods started (Running, not terminating) in the current view",
                             registry=r)
        self.nodes = Gauge("rtt_pods_nodes", "Nodes with at least one of our pods", registry=r)
        self.malformed = Counter("rtt_pods_malformed_total", "Pod objects skipped as malformed", registry=r)
        self.events = Counter("rtt_pods_watch_events_total", "Watch events by type", ["type"], registry=r)
        self.lists = Counter("rtt_pods_lists_total", "Successful lists", registry=r)
        self.written = Counter("rtt_pods_nodes_written_total", "Node keys written to Redis", registry=r)
        self.deleted = Counter("rtt_pods_nodes_deleted_total", "Node keys deleted from Redis", registry=r)
        self.api_errors = Counter("rtt_pods_api_errors_total", "Kubernetes API failures by kind", ["kind"],
                                  registry=r)
        self.redis_errors = Counter("rtt_pods_redis_errors_total", "Failed Redis writes", registry=r)
        self.last_sync = Gauge("rtt_pods_last_sync_timestamp_seconds",
                               "When the whole view was last confirmed and written to Redis (a list, or a renewal "
                               "after the server closed a watch as asked)", registry=r)


class PodWatcher:
    """Keep ``rttsched:{prefix}running:{node}`` equal to the pods the API reports (see the module docstring)."""

    def __init__(self, api: PodsApi, client: Any, keys: CacheKeys, options: PodWatchOptions | None = None,
                 metrics: PodWatchMetrics | None = None, wall: Callable[[], float] = time.time) -> None:
        self.api = api
        self.client = client  # redis.asyncio.Redis
        self.keys = keys
        self.options = options or PodWatchOptions()
        self.metrics = metrics or PodWatchMetrics()
        self.pods: dict[str, Placement] = {}  # pod key -> (node, app, started), the pods that count
        self._written: View = {}  # what Redis holds
        self.last_sync: float | None = None  # wall time the whole view was last confirmed in Redis
        self._wall = wall
        self._failing: set[str] = set()  # error kinds logged since the last success
        self._failures = 0  # consecutive failures, for the backoff

    @property
    def written(self) -> dict[str, dict[str, int]]:
        """The pods that count per node and app, as Redis holds them (the values' ``apps``)."""
        return {node: dict(counts["apps"]) for node, counts in self._written.items()}

    @property
    def started(self) -> dict[str, dict[str, int]]:
        """The pods started per node and app, as Redis holds them (the values' ``started``)."""
        return {node: dict(counts["started"]) for node, counts in self._written.items()}

    # -- one step each
    async def sync(self) -> str:
        """List, replace the pod set, write every key and delete strays; the list's resourceVersion."""
        items, version = await self.api.list_pods()
        pods: dict[str, Placement] = {}
        for item in items:
            try:
                key, where = placement(item)
            except PodError as exc:
                self._malformed(exc)
                continue
            if where is not None:
                pods[key] = where
        self.pods = pods
        await self.flush(every=True, stray=True)
        self.metrics.lists.inc()
        return version

    async def renew(self) -> None:
        """Write every key again from the pods held: a fresh TTL and ``ts``, and keys lost in Redis re-created.

        Called when the server has closed a watch as asked, every change sent: the pods held are the API's, and
        no list is needed.
        """
        await self.flush(every=True)

    def apply(self, events: Iterable[dict[str, Any]], version: str) -> str:
        """Apply watch events to the pod set; the resourceVersion to resume from."""
        for event in events:
            kind, obj = event["type"], event["object"]
            self.metrics.events.labels(kind if kind in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK") else "other").inc()
            meta = obj.get("metadata")
            if isinstance(meta, dict) and isinstance(meta.get("resourceVersion"), str):
                version = meta["resourceVersion"]
            if kind not in ("ADDED", "MODIFIED", "DELETED"):
                continue
            try:
                key, where = placement(obj)
            except PodError as exc:
                self._malformed(exc)
                continue
            if kind == "DELETED" or where is None:
                self.pods.pop(key, None)
            else:
                self.pods[key] = where
        return version

    async def flush(self, every: bool = False, stray: bool = False) -> None:
        """Write the nodes whose counts changed (``every``: all nodes), delete emptied ones.

        ``every`` is a confirmation of the whole view (a list, a renewal): the heartbeat ``running-sync`` is
        written in the same pipeline, and ``last_sync`` set once it is. ``stray`` also deletes the
        ``running:*`` keys of nodes this watcher does not know.
        """
        view = tally(self.pods.values())
        changed, removed = diff_views(self._written, view)
        if every:
            changed = view
        if stray:
            known = set(view) | set(removed)
            removed.extend(sorted({self.keys.kind_of(k)[1] for k in await self._running_keys()} - known))
        if changed or removed or every:
            ttl, now = self.options.key_ttl_ms, self._wall()
            pipe = self.client.pipeline(transaction=False)
            for node, counts in changed.items():
                pipe.set(self.keys.running(node), encode_node(counts, now), px=ttl)
            if removed:
                pipe.delete(*(self.keys.running(node) for node in removed))
            if every:
                pipe.set(self.keys.running_sync(), encode_running_sync(now), px=ttl)
            await pipe.execute()
            if every:
                self._confirmed(now)
            self.metrics.written.inc(len(changed))
            self.metrics.deleted.inc(len(removed))
            log.debug("running-apps view: %d nodes written, %d deleted", len(changed), len(removed))
        self._written = view
        self.metrics.seen.set(sum(sum(c["apps"].values()) for c in view.values()))
        self.metrics.started.set(sum(sum(c["started"].values()) for c in view.values()))
        self.metrics.nodes.set(len(view))

    # -- the loop
    async def run(self) -> None:
        """List, then watch (or list every resync without a watch); after a failure back off and relist.

        Runs forever; cancel the task to stop. A cancel that a failed try turned into an error (a client library
        that caught it as its own timeout) still ends the loop: the task is still cancelling.
        """
        while True:
            try:
                version = await self.sync()
                if self.options.watch:
                    await self._follow(version)
                else:
                    self._recovered()
                    await asyncio.sleep(self.options.resync_s)
            except KubeApiError as exc:
                _cancel_asked()
                self._failures += 1
                self.metrics.api_errors.labels(exc.kind).inc()
                if exc.kind == "gone" and self._failures == 1:  # an expired resource version: relist at once
                    log.debug("watch expired (%s), relisting", exc.detail)
                    continue
                self._failed("kubernetes API", exc.kind, exc.detail)
                await asyncio.sleep(self.wait_s(exc.retry_after_s))
            except (RedisError, OSError) as exc:
                _cancel_asked()
                self._failures += 1
                self.metrics.redis_errors.inc()
                self._failed("redis", type(exc).__name__, str(exc))
                await asyncio.sleep(self.wait_s())

    def wait_s(self, retry_after_s: float | None = None) -> float:
        """The wait before the next try: the backoff, but never less than the server's ``Retry-After``."""
        return max(self.options.backoff_s(self._failures), retry_after_s or 0.0)

    async def _follow(self, version: str) -> None:
        """Watch from ``version`` for good, renewing every key each period the server confirms; returns by raising."""
        while True:
            version = await self._watch_until(version, time.monotonic() + self.options.resync_s)
            await self.renew()

    async def _watch_until(self, version: str, deadline: float) -> str:
        """Apply watch events until the server closes a watch at ``deadline``; the version reached.

        Each watch asks the server to close it at ``deadline`` (``timeoutSeconds``) and is read until it does,
        so a return means the server has just closed one with every change sent: the pods held are the API's
        and may be renewed. A watch accepted but silent confirms nothing: one the server keeps open past its
        timeout, or never answers, raises KubeApiError ``timeout`` (:meth:`PodsApi.watch`), and the run loop
        relists.
        """
        while (left := deadline - time.monotonic()) > 0:
            began, events = time.monotonic(), 0
            async with contextlib.aclosing(self.api.watch(version, left)) as stream:
                async for batch in stream:  # the first, empty batch: accepted, which says nothing of the pods
                    events += len(batch)
                    version = self.apply(batch, version)
                    if batch:
                        await self.flush()
            self._recovered()  # the server closed the watch as asked
            if not events and time.monotonic() - began < self.options.backoff_initial_s:
                await asyncio.sleep(self.options.backoff_initial_s)  # a server that closes at once
        return version

    async def _running_keys(self) -> list[str]:
        out = []
        async for key in self.client.scan_iter(match=self.keys.pattern("running"), count=1000):
            out.append(key.decode() if isinstance(key, bytes) else str(key))
        return out

    def _confirmed(self, now: float) -> None:
        self.last_sync = now
        self.metrics.last_sync.set(now)

    def _malformed(self, exc: PodError) -> None:
        self.metrics.malformed.inc()
        log.debug("malformed pod skipped: %s", exc)

    def _failed(self, what: str, kind: str, detail: str) -> None:
        if kind in self._failing:
            log.debug("%s error %s: %s", what, kind, detail)
            return
        self._failing.add(kind)
        log.warning("%s error %s: %s (retrying with backoff; repeats are logged at debug)", what, kind, detail)

    def _recovered(self) -> None:
        self._failures = 0
        if self._failing:
            log.info("pods view in sync again (after errors: %s)", ", ".join(sorted(self._failing)))
            self._failing.clear()


def _cancel_asked() -> None:
    """Raise CancelledError if the running task was asked to stop and the cancel was caught on its way (the task is
    still cancelling): the watcher's loop must not try again."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
