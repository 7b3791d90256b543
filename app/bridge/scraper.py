"""The scrape loop: every interval, scrape every node's exporters (aiohttp), assemble, produce node-metrics.

Rounds start on a fixed cadence (``RTT_SCRAPE_INTERVAL_S``, default 1 s) measured on the injected clock; a
round that overruns skips the ticks it missed rather than bunching scrapes. Each endpoint has
``RTT_SCRAPE_TIMEOUT_S`` to answer; endpoints are scraped concurrently (at most ``concurrency`` at once).

A slow node does not hold the others: a round starts a scrape of every node that has none under way, waits
:data:`ROUND_WAIT_SHARE` of the interval for them, and publishes the nodes whose scrape is over. A node whose
scrape is still under way (an exporter that hangs or answers late) is counted in
``rtt_bridge_scrapes_late_total{node, url}`` per endpoint in flight -- one WARNING when it starts being late and
one INFO line when a scrape of it is over within its round again -- and is not scraped again while it is. Its
scrape, once over (answered, or failed at ``RTT_SCRAPE_TIMEOUT_S``), is published at the start of the next round,
with the time it started at, so its rates span the real interval between its scrapes; that round also starts a new
scrape of the node, published after it when it is over in time. An exporter answering in 0.8 to 1 interval thus
goes out every round, one round late. A late scrape over during a round's wait goes out in that round, and the
node's next scrape starts at the next round's tick, never back to back. The last round of a bounded run
(``scrapes``) waits for every scrape under way. Once a stop is asked, the round under way waits for the scrapes
under way :data:`STOP_WAIT_SHARE` of ``STOP_S`` at most (the rest is for the publish and the producer's stop),
publishes every scrape that is over and cancels the ones still running.

Tests run a given number of rounds with a :class:`~app.clock.ManualClock` and a ``sleep`` that advances
it, so the intervals the rates see are exact::

    clock = ManualClock(0.0)
    async def sleep(s): clock.advance(s)
    await run_bridge(settings, targets, scrapes=2, clock=clock, sleep=sleep)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp
from aiokafka.errors import KafkaError

from app.bridge.mapping import MetricMap, load_mapping
from app.bridge.metrics import BridgeMetrics
from app.bridge.producer import STOP_S, publish_node_metrics, start_producer, stop_producer
from app.bridge.running import RunningPods
from app.bridge.snapshot import NodeAssembler, Skip, Snapshot, TargetResult
from app.bridge.targets import Target, check_exporter, check_unique
from app.clock import Clock, SystemClock
from app.config import Settings
from app.contracts.codec import validate
from app.errors import ContractError
from app.redis_client import settings_redis
from app.scheduler.cache import CacheKeys

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024 * 1024
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"  # the text format, not OpenMetrics or protobuf
PROGRESS_EVERY_S = 60.0
UNPUBLISHED_LOG_S = 10.0  # while Kafka does not take node-metrics, say so at most this often
SKIP_LOG_S = 60.0  # an endpoint's intervals skipped for one reason: logged at most this often
ROUND_WAIT_SHARE = 0.8  # of the interval a round waits for its scrapes; the rest is for publishing
STOP_WAIT_SHARE = 0.6  # of STOP_S the scrapes under way at a stop get; the rest is for the publish and the producer


@dataclasses.dataclass
class BridgeStats:
    rounds: int = 0
    messages: int = 0
    failed_scrapes: int = 0
    troubles: int = 0
    unpublished: int = 0  # rounds whose node-metrics the broker did not take
    abandoned: int = 0  # rounds a stop cut short (not done within STOP_S of it)


class Bridge:
    """Scrapes the targets and assembles one :class:`Snapshot` per node per round. Use ``async with``."""

    def __init__(self, settings: Settings, targets: Sequence[Target], *, mapping: MetricMap | None = None,
                 clock: Clock | None = None, metrics: BridgeMetrics | None = None, concurrency: int = 64,
                 running: RunningPods | None = None) -> None:
        check_unique(targets)
        self.running = running
        self.settings = settings
        self.mapping = mapping or load_mapping()
        for t in targets:  # a declared exporter the mapping does not know would withhold nothing when it fails
            for e in t.endpoints:
                if e.exporter is not None:
                    check_exporter(f"{t.node}: {e.url}: exporter", e.exporter, tuple(self.mapping.exporters))
        self.clock = clock or SystemClock()
        self.metrics = metrics or BridgeMetrics()
        self.assemblers = [NodeAssembler(t, self.mapping) for t in targets]
        self._limit = asyncio.Semaphore(concurrency)
        self._session: aiohttp.ClientSession | None = None
        self._active: set[tuple[str, str, str, str]] = set()  # last round's troubles: node, exporter, kind, subject
        self._where: dict[tuple[str, str, str, str], str] = {}  # a scrape_failed trouble -> its endpoints' URLs
        self._skip_logged: dict[tuple[str, str, str], tuple[float, int]] = {}  # -> last logged, skipped since
        self._pending: dict[str, asyncio.Task[Snapshot]] = {}  # node -> its scrape under way
        self._in_flight: dict[str, float] = {}  # url -> perf_counter when its GET started
        self._late: dict[str, tuple[tuple[str, ...], int]] = {}  # node late -> urls in flight then, rounds missed
        self._cancelled: list[asyncio.Task[Snapshot]] = []  # scrapes a stop cancelled, awaited on the way out

    async def __aenter__(self) -> Bridge:
        timeout = aiohttp.ClientTimeout(total=self.settings.scrape_timeout_s)
        self._session = aiohttp.ClientSession(timeout=timeout, headers={"Accept": ACCEPT})
        return self

    async def __aexit__(self, *exc: object) -> None:
        pending = list(self._pending.values()) + self._cancelled
        self._pending.clear()
        self._cancelled.clear()
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def fetch(self, url: str) -> TargetResult:
        """One GET; never raises for a network or HTTP problem (the result carries the error)."""
        assert self._session is not None, "use `async with Bridge(...)`"
        t = self.clock.monotonic()
        started = time.perf_counter()
        body: str | None = None
        error: str | None = None
        async with self._limit:
            self._in_flight[url] = started
            try:
                async with self._session.get(url) as resp:
                    if resp.status != 200:
                        error = f"HTTP {resp.status}"
                    else:
                        data = bytearray()
                        async for chunk in resp.content.iter_chunked(65536):
                            data += chunk
                            if len(data) > MAX_BODY_BYTES:
                                raise ValueError(f"body larger than {MAX_BODY_BYTES} bytes")
                        body = data.decode("utf-8", errors="replace")
            except TimeoutError:
                error = f"timeout after {self.settings.scrape_timeout_s:g}s"
            except (aiohttp.ClientError, ValueError) as exc:
                error = f"{type(exc).__name__}: {exc}"
            finally:
                self._in_flight.pop(url, None)
        return TargetResult(url, t, body, error, time.perf_counter() - started)

    async def scrape_node(self, assembler: NodeAssembler) -> Snapshot:
        ts = self.clock.now()
        results = await asyncio.gather(*(self.fetch(u) for u in assembler.target.urls))
        node = assembler.target.node
        snap = assembler.assemble(results, ts, self.running.gpu_pods(node) if self.running else None)
        for r in results:  # failed: no 200, or a body that is no exposition or has no metric the mapping reads
            self.metrics.scrapes.labels(node=node, url=r.url, result="failed" if r.url in snap.failed else "ok").inc()
            self.metrics.scrape_seconds.observe(r.duration_s)
        urls: dict[str, list[str]] = {}  # exporter -> its failed urls, for the lines
        for e in assembler.target.endpoints:
            if e.url in snap.failed:
                urls.setdefault(assembler.exporter_name(e), []).append(e.url)
        self._account(node, snap, urls)
        return snap

    def _account(self, node: str, snap: Snapshot, failed_urls: dict[str, list[str]] | None = None) -> None:
        self.metrics.node_gpu.labels(node=node).set(1.0 if snap.message.get("node_class") == "gpu" else 0.0)
        now = set()
        for t in snap.troubles:
            self.metrics.trouble.labels(node=node, exporter=t.exporter, kind=t.kind).inc()
            key = (node, t.exporter, t.kind, t.subject)
            now.add(key)
            if key not in self._active:
                source = "an exporter not identified yet" if t.exporter == "unknown" else t.exporter
                where = (failed_urls or {}).get(t.exporter) if t.kind == "scrape_failed" else None
                if where:
                    source += f" at {', '.join(where)}"
                    self._where[key] = ", ".join(where)
                withheld = f"; withholding {', '.join(t.groups)}" if t.groups else ""
                log.warning("%s: %s from %s: %s%s", node, t.kind, source, t.detail, withheld)
        gone = set()
        for t in snap.forgotten:
            gone.add((node, t.exporter, t.kind, t.subject))
            log.warning("%s: %s from %s: %s", node, t.kind, t.exporter, t.detail)
        for key in sorted({k for k in self._active if k[0] == node} - now - gone):
            _, exporter, kind, subject = key
            urls = self._where.pop(key, None)
            source = "the exporter" if exporter == "unknown" else exporter
            source += f" at {urls}" if urls else ""
            log.info("%s: %s %s cleared%s", node, source, kind, f" ({subject})" if subject else "")
        for key in gone:
            self._where.pop(key, None)
        self._active = {k for k in self._active if k[0] != node} | now
        for exporter, n in snap.dropped.items():
            self.metrics.dropped.labels(exporter=exporter).inc(n)
        for metric, n in snap.clamped.items():
            self.metrics.clamped.labels(metric=metric).inc(n)
        for metric, n in snap.rejected.items():
            self.metrics.rejected.labels(metric=metric).inc(n)
        for skip in snap.skips:
            self.metrics.intervals_skipped.labels(node=node, url=skip.url, reason=skip.reason).inc()
            self._log_skip(node, skip)

    def _log_skip(self, node: str, skip: Skip) -> None:
        """One line per endpoint and reason at most every ``SKIP_LOG_S``, with how many were skipped since."""
        key, now = (node, skip.url, skip.reason), self.clock.monotonic()
        last, since = self._skip_logged.get(key, (-math.inf, 0))
        if now - last < SKIP_LOG_S:
            self._skip_logged[key] = (last, since + 1)
            return
        self._skip_logged[key] = (now, 0)
        more = f" ({since} more since the last report)" if since else ""
        reset = skip.reason == "counter_reset"  # a restart: those series only, and no sign of trouble
        log.log(logging.INFO if reset else logging.WARNING, "%s: %s: %s, %s: %s rates skipped%s", node, skip.url,
                skip.reason, skip.detail, "their" if reset else "that interval's", more)

    async def scrape_all(self) -> list[Snapshot]:
        """One round: every node, concurrently, waiting for all of them."""
        return await self.scrape_round(None)

    async def scrape_round(self, wait_s: float | None, *, stop: asyncio.Event | None = None,
                           start: bool = True, stop_wait_s: float | None = None) -> list[Snapshot]:
        """One round: the snapshots of the nodes whose scrape is over within ``wait_s`` seconds (None: all of them),
        in the targets' order. It starts a scrape of every node that has none under way (``start``), and of every
        node whose late scrape is over by now: that one is published first, then the new one if it is over in
        time, so a node's ``ts`` stays in order. A late scrape over during the wait is published, and the node's
        next scrape starts in the next round. A node whose scrape is still under way is counted late and left for a
        later round, its scrape going on. Once ``stop`` is set, the round starts none and waits for the scrapes
        under way ``stop_wait_s`` seconds more at most (None: until all are over); the ones still running then are
        cancelled, and every one over goes out."""
        started = set()
        carried: dict[str, Snapshot] = {}  # node -> its late scrape, over since the last round
        for a in self.assemblers:
            node = a.target.node
            task = self._pending.get(node)
            if task is not None and task.done():
                carried[node] = self._pending.pop(node).result()
            if start and node not in self._pending:
                self._pending[node] = asyncio.ensure_future(self.scrape_node(a))
                started.add(node)
        await self._wait(wait_s, stop, stop_wait_s)
        stopped = stop is not None and stop.is_set()
        out = []
        for a in self.assemblers:
            node = a.target.node
            if node in carried:
                out.append(carried[node])
            task = self._pending.get(node)
            if task is None:
                continue
            if not task.done():
                if stopped:
                    self._cancel(a)
                else:
                    self._count_late(a, wait_s or 0.0)
                continue
            del self._pending[node]
            out.append(task.result())
            if node in started:
                self._on_time(node)
        return out

    async def _wait(self, wait_s: float | None, stop: asyncio.Event | None, stop_wait_s: float | None) -> None:
        """Wait for the scrapes under way: ``wait_s`` seconds at most (None: until all are over); once ``stop`` is
        set, ``stop_wait_s`` seconds from then at most (None: until all are over)."""
        left = {t for t in self._pending.values() if not t.done()}
        if not left:
            return
        if stop is None:
            await asyncio.wait(left, timeout=wait_s)
            return
        loop = asyncio.get_running_loop()
        deadline = None if wait_s is None else loop.time() + wait_s
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while left and not stop.is_set():
                timeout = None if deadline is None else deadline - loop.time()
                if timeout is not None and timeout <= 0:
                    break
                done, _ = await asyncio.wait(left | {stopping}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                left -= done
            if stop.is_set() and left and (stop_wait_s is None or stop_wait_s > 0):
                await asyncio.wait(left, timeout=stop_wait_s)
        finally:
            stopping.cancel()

    def _cancel(self, assembler: NodeAssembler) -> None:
        """A stop leaves no time for ``assembler``'s scrape under way: cancelled, the node not published."""
        node = assembler.target.node
        task = self._pending.pop(node)
        task.cancel()
        self._cancelled.append(task)
        urls = [u for u in assembler.target.urls if u in self._in_flight] or list(assembler.target.urls)
        log.warning("%s: scrape of %s still under way at the stop: cancelled, the node not published", node,
                    ", ".join(urls))

    def pending(self) -> int:
        """Nodes whose scrape is under way, or over and not yet published."""
        return len(self._pending)

    def _count_late(self, assembler: NodeAssembler, wait_s: float) -> None:
        node = assembler.target.node
        now = time.perf_counter()
        flying = [u for u in assembler.target.urls if u in self._in_flight]
        for url in flying or assembler.target.urls:  # none in flight: all waiting for the concurrency limit
            self.metrics.late.labels(node=node, url=url).inc()
        if node in self._late:
            urls, missed = self._late[node]
            self._late[node] = (urls, missed + 1)
            return
        urls = tuple(flying) or assembler.target.urls
        self._late[node] = (urls, 1)
        took = max((now - self._in_flight[u] for u in flying), default=wait_s)
        log.warning("%s: scrape of %s still under way after %.2gs: the node goes out in the round after its scrape "
                    "is over, and is not scraped again meanwhile (RTT_SCRAPE_TIMEOUT_S %gs bounds it); the other "
                    "nodes keep their %gs interval", node, ", ".join(urls), took, self.settings.scrape_timeout_s,
                    self.settings.scrape_interval_s)

    def _on_time(self, node: str) -> None:
        """A scrape of ``node`` was over within the round it started in: the end of its lateness, if it was late."""
        if node in self._late:
            urls, missed = self._late.pop(node)
            log.info("%s: scrape of %s over within its round again, after %d round(s) it was late in",
                        node, ", ".join(urls), missed)


def _valid(snaps: list[Snapshot], metrics: BridgeMetrics) -> list[dict[str, Any]]:
    """The messages that satisfy the node-metrics contract; any other is logged and counted, never sent."""
    out = []
    for s in snaps:
        try:
            out.append(validate("node-metrics", s.message))
        except ContractError as exc:
            log.error("%s: node-metrics message breaks the contract, not sent: %s", s.message.get("node"), exc)
            metrics.skipped.labels(source="node-metrics", reason=exc.reason).inc()
    return out


async def run_bridge(settings: Settings, targets: Sequence[Target], *, scrapes: int | None = None,
                     clock: Clock | None = None, sleep: Callable[[float], Awaitable[Any]] | None = None,
                     producer: Any = None, publish: bool = True, mapping: MetricMap | None = None,
                     metrics: BridgeMetrics | None = None,
                     on_round: Callable[[list[Snapshot]], None] | None = None,
                     stop: asyncio.Event | None = None,
                     on_started: Callable[[], object] | None = None) -> BridgeStats:
    """Scrape ``targets`` every ``settings.scrape_interval_s`` and produce node-metrics.

    ``scrapes``: rounds to run (None = until cancelled or stopped). ``stop``: once set, no round starts; the round
    under way has until :data:`~app.bridge.producer.STOP_S` after it to finish (else it is abandoned,
    ``stats.abandoned``), and the producer's delivery of what it holds gets what is left of that, 1 s at least.
    ``producer``: a started ``AIOKafkaProducer`` to use (else one is started and stopped here); ``publish=False``
    produces nothing (``on_round`` still sees every round). With ``REDIS_URL`` set, the running-pods view is read
    in the background for the GPU hang check (:mod:`app.bridge.running`). ``on_started`` is called once the producer
    has started (the one given, or its own), before the first round. Returns counts of what was done.
    """
    clock = clock or SystemClock()
    sleep = sleep or asyncio.sleep
    metrics = metrics or BridgeMetrics()
    stop = stop or asyncio.Event()
    stats = BridgeStats()
    own = publish and producer is None
    if own:
        producer = await start_producer(settings)
    if on_started is not None:
        on_started()
    interval = settings.scrape_interval_s
    running, redis_client, refresher = None, None, None
    loop = asyncio.get_running_loop()
    stopping = loop.create_task(stop.wait(), name="bridge-stop")
    asked = [math.inf]  # loop time the stop was asked at
    stopping.add_done_callback(lambda f: asked.__setitem__(0, math.inf if f.cancelled() else loop.time()))
    try:  # cancelled from here on (Ctrl-C), the producer and the Redis client are closed
        if settings.redis_url:
            redis_client = settings_redis(settings)
            apps = [a.strip() for a in settings.bridge_gpu_apps.split(",") if a.strip()]
            running = RunningPods(redis_client, CacheKeys(settings.topic_prefix), gpu_apps=apps,
                                  refresh_s=settings.bridge_running_refresh_s)
            # a first view before the first round, never a long wait; not asyncio.wait_for: in Python 3.11 it
            # loses a cancel (Ctrl-C) that comes as the view is read, and the bridge ran on
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(settings.scrape_timeout_s):
                    await running.refresh()
            refresher = loop.create_task(running.run(delay=True), name="bridge-running-pods")
        async with Bridge(settings, targets, mapping=mapping, clock=clock, metrics=metrics,
                          running=running) as bridge:
            last_unpublished = -math.inf

            async def one_round(start: bool = True) -> None:
                nonlocal last_unpublished
                last = scrapes is not None and stats.rounds == scrapes - 1
                stop_wait_s = STOP_S * STOP_WAIT_SHARE  # from the stop, seen in the round's wait
                if not start:  # the stop was asked before this round: what is left of that share
                    stop_wait_s = max(0.0, asked[0] + stop_wait_s - loop.time())
                snaps = await bridge.scrape_round(None if last else interval * ROUND_WAIT_SHARE, stop=stop,
                                                  start=start, stop_wait_s=stop_wait_s)
                if not start and not snaps:
                    return
                if start:
                    stats.rounds += 1
                stats.troubles += sum(len(s.troubles) for s in snaps)
                stats.failed_scrapes += sum(1 for s in snaps for t in s.troubles if t.kind == "scrape_failed")
                if on_round is not None:
                    on_round(snaps)
                if publish:
                    try:
                        stats.messages += await publish_node_metrics(producer, settings, _valid(snaps, metrics),
                                                                     metrics=metrics)
                    except KafkaError as exc:  # broker away: this round is dropped, scraping goes on
                        stats.unpublished += 1
                        metrics.unpublished.labels(topic="node-metrics").inc()
                        now = clock.monotonic()
                        if now - last_unpublished >= UNPUBLISHED_LOG_S:
                            log.warning("node-metrics not published (%r): Kafka at %s not taking them; scraping "
                                        "goes on, %d round(s) dropped so far", exc, settings.bootstrap_servers,
                                        stats.unpublished)
                            last_unpublished = now

            next_t = clock.monotonic()
            last_progress = next_t
            while (scrapes is None or stats.rounds < scrapes) and not stop.is_set():
                if not await _unless_stopped(one_round(), stopping, STOP_S):
                    stats.abandoned += 1
                    break
                if stop.is_set() or (scrapes is not None and stats.rounds >= scrapes):
                    break
                now = clock.monotonic()
                if now - last_progress >= PROGRESS_EVERY_S:
                    log.info("bridge: %d rounds, %d messages, %d failed scrapes", stats.rounds, stats.messages,
                             stats.failed_scrapes)
                    last_progress = now
                next_t += interval
                if next_t < now:
                    missed = math.ceil((now - next_t) / interval)
                    metrics.ticks_skipped.inc(missed)
                    log.warning("scrape round overran the %gs interval; skipping %d tick(s)", interval, missed)
                    next_t += missed * interval
                await _unless_stopped(sleep(next_t - now), stopping, 0.0)
            # a stop asked after its round's wait (publishing, or between rounds): the scrapes under way go out
            if stop.is_set() and bridge.pending() and not stats.abandoned:
                await asyncio.wait({stopping})  # (its callback has set asked)
                if not await _unless_stopped(one_round(start=False), stopping,
                                             max(0.0, min(STOP_S, asked[0] + STOP_S - loop.time()))):
                    stats.abandoned += 1
    finally:
        stopping.cancel()
        if refresher is not None:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
        if redis_client is not None:
            await redis_client.aclose()
        if own:
            await stop_producer(producer, settings, max(1.0, min(STOP_S, asked[0] + STOP_S - loop.time())))
    return stats


async def _unless_stopped(work: Awaitable[Any], stopping: asyncio.Future[Any], grace_s: float) -> bool:
    """Await ``work`` -- once ``stopping`` is done, for ``grace_s`` more at most: whether it finished (else it is
    cancelled)."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            await asyncio.wait({task}, timeout=grace_s)
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        return False
    task.result()  # its error, if any
    return True
