"""A stop asked of the scrape loop (what SIGTERM does in ``rttsched bridge``): no round starts, the round under way
may finish within ``STOP_S``, else it is abandoned; the producer's stop is bounded (no broker: publish=False, and a
producer that never finishes stopping)."""

from __future__ import annotations

import asyncio
import logging
import time

from bridge_fixtures import NODE_A, NODE_B, ExporterServer

import app.bridge.scraper as scraper
from app.bridge.producer import stop_producer
from app.bridge.scraper import run_bridge
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


async def test_a_round_longer_than_the_stop_allows_is_abandoned(monkeypatch):
    monkeypatch.setattr(scraper, "STOP_S", 0.2)
    stop = asyncio.Event()
    async with ExporterServer({"/node": [NODE_A, 3.0]}) as srv:
        target = Target("worker-3", (Endpoint(srv.url("/node"), "node_exporter"),))
        settings = Settings(scrape_interval_s=0.05, scrape_timeout_s=10.0)
        asking = asyncio.ensure_future(stop_when(lambda: srv.hits["/node"] == 2, stop))
        started = time.monotonic()
        # the last round of a bounded run waits for every scrape under way (another leaves a late node out)
        stats = await run_bridge(settings, [target], scrapes=2, publish=False, stop=stop)
        took = time.monotonic() - started
        await asking
    assert took < 2.0  # not the 3 s the exporter stalls
    assert (stats.rounds, stats.abandoned) == (1, 1)


async def test_a_stop_does_not_wait_for_a_scrape_still_under_way():
    stop = asyncio.Event()
    async with ExporterServer({"/node": [NODE_A, 3.0]}) as srv:
        target = Target("worker-3", (Endpoint(srv.url("/node"), "node_exporter"),))
        settings = Settings(scrape_interval_s=0.05, scrape_timeout_s=10.0)
        asking = asyncio.ensure_future(stop_when(lambda: srv.hits["/node"] == 2, stop))
        started = time.monotonic()
        stats = await run_bridge(settings, [target], publish=False, stop=stop)
        took = time.monotonic() - started
        await asking
    assert took < 2.0  # not the 3 s the exporter stalls: the scrape under way is cancelled
    assert stats.rounds >= 2 and stats.abandoned == 0


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
