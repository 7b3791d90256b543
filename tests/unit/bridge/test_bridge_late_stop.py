"""A slow or hung exporter at a stop, in ``--once``, and between rounds: the other nodes still go out, one line per
node is printed, and a slow node is never scraped back to back."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from bridge_fixtures import NODE_A, NODE_B, ExporterServer

import app.bridge.scraper as scraper
from app.bridge.scraper import run_bridge
from app.bridge.snapshot import Snapshot
from app.bridge.targets import Endpoint, Target
from app.cli.main import main
from app.config import Settings


async def stop_when(cond: Callable[[], bool], stop: asyncio.Event) -> None:
    while not cond():
        await asyncio.sleep(0.01)
    stop.set()


async def _stop_with_one_hung(settings: Settings, hang_s: float) -> tuple[list[str], scraper.BridgeStats, float]:
    stop = asyncio.Event()
    rounds: list[list[Snapshot]] = []
    async with ExporterServer({"/fast": [NODE_A, NODE_B], "/hung": [NODE_A, hang_s]}) as srv:
        fast = Target("fast", (Endpoint(srv.url("/fast"), "node_exporter"),))
        hung = Target("hung", (Endpoint(srv.url("/hung"), "node_exporter"),))
        asking = asyncio.ensure_future(stop_when(lambda: srv.hits["/hung"] == 2 and srv.hits["/fast"] == 2, stop))
        stats = await run_bridge(settings, [fast, hung], publish=False, stop=stop, on_round=rounds.append)
        took = time.monotonic()
        await asking
    return [s.message["node"] for r in rounds for s in r], stats, took


async def test_a_stop_with_one_hung_node_still_publishes_the_nodes_that_answered(monkeypatch):
    monkeypatch.setattr(scraper, "STOP_S", 0.5)
    t0 = time.monotonic()
    nodes, stats, end = await _stop_with_one_hung(Settings(scrape_interval_s=0.5, scrape_timeout_s=10.0), 5.0)
    assert nodes.count("fast") == 2 and nodes.count("hung") == 1, (nodes, stats)
    assert stats.abandoned == 0 and stats.rounds == 2
    assert end - t0 < 0.5 + 0.4 + 0.5 + 0.5  # two rounds' start, the second round's wait, the stop's bound


async def test_with_the_runbooks_raised_scrape_timeout_a_stop_keeps_the_answered_nodes():
    """RTT_SCRAPE_TIMEOUT_S above STOP_S (runbook §1 step 8): the hung scrape is cancelled at the stop's bound."""
    nodes, stats, _ = await _stop_with_one_hung(Settings(scrape_interval_s=0.5, scrape_timeout_s=8.0), 30.0)
    assert nodes.count("fast") == 2 and nodes.count("hung") == 1, (nodes, stats)
    assert stats.abandoned == 0


async def test_a_late_scrape_over_at_a_stop_goes_out_with_the_others(monkeypatch):
    """A node late in the round before the stop, its scrape over during the stop's wait: it goes out too."""
    monkeypatch.setattr(scraper, "STOP_S", 2.0)
    nodes, stats, _ = await _stop_with_one_hung(Settings(scrape_interval_s=0.5, scrape_timeout_s=10.0), 0.6)
    assert nodes.count("fast") == 2 and nodes.count("hung") == 2, (nodes, stats)
    assert stats.abandoned == 0


@pytest.fixture
def slow_exporter() -> Iterator[tuple[str, list[tuple[float, float]]]]:
    """An exporter answering NODE_A then NODE_B after 0.45 s; the wall-clock (start, end) of each scrape."""
    pages = [NODE_A.read_bytes(), NODE_B.read_bytes()]
    spans: list[tuple[float, float]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            t0 = time.time()
            n = len(spans)
            time.sleep(0.45)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(pages[min(n, 1)])
            spans.append((t0, time.time()))

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics", spans
    finally:
        server.shutdown()
        server.server_close()


def test_once_prints_one_line_per_node_with_a_slow_exporter(slow_exporter, monkeypatch, capsys):
    """0.9 interval: the first scrape is late and goes out in the second round with the second; only the newest,
    the one with rates, is printed."""
    url, spans = slow_exporter
    monkeypatch.setenv("RTT_SCRAPE_INTERVAL_S", "0.5")
    assert main(["bridge", "--target", f"node=slow,url={url}", "--once"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [s["node"] for s in lines] == ["slow"], lines
    assert len(spans) == 2 and lines[0]["ts"] >= spans[1][0] - 0.05, (lines[0]["ts"], spans)  # the second scrape's


async def test_an_exporter_slower_than_the_interval_waits_for_the_next_tick():
    """1.5 interval: each scrape starts at a round's tick, never the moment the one before it is over."""
    stop = asyncio.Event()
    starts: list[float] = []
    ends: list[float] = []

    class Slow(ExporterServer):
        async def _handle(self, request):  # noqa: ANN001, ANN202
            from aiohttp import web

            starts.append(time.monotonic())
            self.hits[request.path] += 1
            await asyncio.sleep(0.6)
            ends.append(time.monotonic())
            return web.Response(text=NODE_A.read_text(), content_type="text/plain")

    async with Slow({"/slow": []}) as srv:
        t = Target("slow", (Endpoint(srv.url("/slow"), "node_exporter"),))
        asking = asyncio.ensure_future(stop_when(lambda: len(starts) >= 4, stop))
        await run_bridge(Settings(scrape_interval_s=0.4, scrape_timeout_s=5.0), [t], publish=False, stop=stop)
        await asking
    gaps = [s - e for s, e in zip(starts[1:], ends, strict=False)]
    assert all(g > 0.05 for g in gaps), gaps  # back to back: some 0.001 s
    t0 = starts[0]  # and on the 0.4 s ticks: the scrape over at 0.6 waits for 0.8
    assert all(abs((s - t0) / 0.4 - round((s - t0) / 0.4)) < 0.15 for s in starts), [s - t0 for s in starts]
