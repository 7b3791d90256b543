"""A stop asked of the scrape loop (what SIGTERM does in ``rttsched bridge``): no round starts, the round under way
may finish within ``STOP_S``, else it is abandoned; the producer's stop is bounded (no broker: publish=False, and a
producer that never finishes stopping)."""

from __future__ import annotations

import asyncio
import logging
import time

from bridge_fixtures import NODE_A, NODE_B, ExporterServer
from prometheus_client import CollectorRegistry

import app.bridge.scraper as scraper
from app.bridge.metrics import BridgeMetrics
from app.bridge.producer import stop_producer
from app.bridge.scraper import run_bridge
from app.bridge.snapshot import Snapshot
from app.bridge.targets import Endpoint, Target
from app.config import Settings


async def stop_when(cond, stop: asyncio.Event) -> None:  # noqa: ANN001
    while not cond():
        await asyncio.sleep(0.01)
    stop.set()


async def test_a_stop_during_the_wait_ends_the_loop_at_once():
    stop = asyncio.Event()
    async with ExporterServer({"/node": [NODE_A, NODE_B]}) as srv:
        target = Target("worker-3", (Endpoint(srv.url("/node"), "node_exporter"),))
        settings = Settings(scrape_interval_s=30.0)
        started = time.monotonic()
        stats = await run_bridge(settings, [target], publish=False, stop=stop, on_round=lambda _: stop.set())
        took = time.monotonic() - started
    assert took < 5.0  # not the 30 s interval
    assert (stats.rounds, stats.abandoned, srv.hits["/node"]) == (1, 0, 1)


async def test_the_round_under_way_finishes_when_it_can_within_the_stop():
    stop = asyncio.Event()
    rounds = []
    async with ExporterServer({"/node": [NODE_A, 0.5, NODE_B]}) as srv:
        target = Target("worker-3", (Endpoint(srv.url("/node"), "node_exporter"),))
        settings = Settings(scrape_interval_s=0.05, scrape_timeout_s=5.0)
        asking = asyncio.ensure_future(stop_when(lambda: srv.hits["/node"] == 2, stop))  # the second scrape stalls
        stats = await run_bridge(settings, [target], publish=False, stop=stop, on_round=rounds.append)
        await asking
    assert (stats.rounds, stats.abandoned, len(rounds), srv.hits["/node"]) == (2, 0, 2, 2)


async def test_a_scrape_longer_than_the_stop_allows_is_cancelled_and_the_round_goes_out(monkeypatch):
    monkeypatch.setattr(scraper, "STOP_S", 0.2)
    stop = asyncio.Event()
    rounds: list[list[Snapshot]] = []
    async with ExporterServer({"/node": [NODE_A, 5.0]}) as srv:
        target = Target("worker-3", (Endpoint(srv.url("/node"), "node_exporter"),))
        settings = Settings(scrape_interval_s=0.5, scrape_timeout_s=10.0)
        asking = asyncio.ensure_future(stop_when(lambda: srv.hits["/node"] == 2, stop))
        started = time.monotonic()
        stats = await run_bridge(settings, [target], publish=False, stop=stop, on_round=rounds.append)
        took = time.monotonic() - started
        await asking
    assert took < 3.0  # not the 5 s the exporter stalls
    assert (stats.rounds, stats.abandoned, [len(r) for r in rounds]) == (2, 0, [1, 0])


async def test_a_publish_longer_than_the_stop_allows_is_abandoned(monkeypatch):
    monkeypatch.setattr(scraper, "STOP_S", 0.2)

    async def hangs(*args: object, **kwargs: object) -> int:
        await asyncio.sleep(30)
        return 0

    monkeypatch.setattr(scraper, "publish_node_metrics", hangs)
    stop = asyncio.Event()
    async with ExporterServer({"/node": [NODE_A]}) as srv:
        target = Target("worker-3", (Endpoint(srv.url("/node"), "node_exporter"),))
        asking = asyncio.ensure_future(stop_when(lambda: srv.hits["/node"] == 1, stop))
        started = time.monotonic()
        stats = await run_bridge(Settings(scrape_interval_s=0.5), [target], producer=object(), stop=stop)
        took = time.monotonic() - started
        await asking
    assert took < 3.0 and (stats.rounds, stats.abandoned) == (1, 1)


async def test_a_stop_during_a_round_waits_for_its_slow_scrape_and_publishes_it():
    """Asked while a round waits for a scrape that takes longer than the round would (1 s on a 0.5 s interval):
    the round waits for it, within STOP_S, and it goes out."""
    stop = asyncio.Event()
    rounds: list[list[Snapshot]] = []
    async with ExporterServer({"/node": [NODE_A, 1.0]}) as srv:
        target = Target("worker-3", (Endpoint(srv.url("/node"), "node_exporter"),))
        settings = Settings(scrape_interval_s=0.5, scrape_timeout_s=10.0)
        asking = asyncio.ensure_future(stop_when(lambda: srv.hits["/node"] == 2, stop))
        started = time.monotonic()
        stats = await run_bridge(settings, [target], publish=False, stop=stop, on_round=rounds.append)
        took = time.monotonic() - started
        await asking
    assert 1.4 < took < 4.0  # the scrape's 1 s after the second round's start, not the 5 s STOP_S
    assert (stats.rounds, stats.abandoned, srv.hits["/node"]) == (2, 0, 2)
    assert [len(snaps) for snaps in rounds] == [1, 1]  # the second scrape went out


async def test_a_stop_between_rounds_publishes_the_late_scrape_still_under_way():
    """Asked after a round left a late node out (the stop comes while the loop waits for the next round): no
    round starts, and the scrape under way goes out once over."""
    stop = asyncio.Event()
    metrics = BridgeMetrics(CollectorRegistry())
    published: list[Snapshot] = []
    async with ExporterServer({"/node": [NODE_A, 1.2]}) as srv:
        url = srv.url("/node")
        target = Target("worker-3", (Endpoint(url, "node_exporter"),))
        settings = Settings(scrape_interval_s=1.0, scrape_timeout_s=10.0)
        late = lambda: metrics.value("rtt_bridge_scrapes_late_total", node="worker-3", url=url) > 0  # noqa: E731
        asking = asyncio.ensure_future(stop_when(late, stop))
        stats = await run_bridge(settings, [target], publish=False, stop=stop, metrics=metrics,
                                 on_round=published.extend)
        await asking
    assert stats.abandoned == 0 and srv.hits["/node"] == 2  # no scrape after the stop
    assert len(published) == 2 and published[0].message["ts"] < published[1].message["ts"]


class _Stuck:
    """A producer whose stop waits for a broker that never answers."""

    cancelled = False

    async def stop(self) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled = True
            raise


class _Quick:
    async def stop(self) -> None:
        await asyncio.sleep(0)


async def test_stopping_the_producer_is_bounded_and_says_what_was_lost(caplog):
    stuck = _Stuck()
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="app.bridge.producer"):
        assert await stop_producer(stuck, Settings(kafka_bootstrap="kafka:9092"), 0.2) is False  # type: ignore[arg-type]
    assert time.monotonic() - started < 1.0 and stuck.cancelled
    [record] = caplog.records
    said = record.getMessage()
    assert "kafka:9092" in said and "within 0.2s" in said and "not delivered" in said
    assert await stop_producer(_Quick(), Settings(), 0.2) is True  # type: ignore[arg-type]
