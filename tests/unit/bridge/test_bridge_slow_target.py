"""A slow or hung exporter does not hold the bridge's other nodes: real HTTP servers on free ports, one hanging.

The hanging exporter is a threaded ``http.server`` that holds each request until the test lets it go (never
the bridge's own event loop); the good one is :class:`ExporterServer`.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry

from app.bridge.metrics import BridgeMetrics
from app.bridge.scraper import run_bridge
from app.bridge.snapshot import Snapshot
from app.bridge.targets import Endpoint, Target
from app.config import Settings
from tests.unit.bridge.bridge_fixtures import NODE_A, ExporterServer

INTERVAL_S = 0.4
ROUNDS = 10
RELEASE_AFTER = 4  # rounds with the exporter hanging
PAGE = NODE_A.read_bytes()
CTX = "node_context_switches_total"


Reply = tuple[float, bytes]  # seconds to hold the request (math.inf: until released), then that page


@contextmanager
def scripted_exporter(replies: list[Reply], release: threading.Event | None = None) -> Iterator[str]:
    """An exporter answering its requests with ``replies`` in turn (the last repeats), each held its seconds, or
    until ``release`` is set."""
    release = release or threading.Event()
    hits = [0]
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            with lock:
                hold_s, page = replies[min(hits[0], len(replies) - 1)]
                hits[0] += 1
            release.wait(30.0 if math.isinf(hold_s) else hold_s)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        release.set()
        server.shutdown()
        server.server_close()


async def test_a_hung_exporter_does_not_hold_the_other_nodes_rounds(caplog):
    metrics = BridgeMetrics(CollectorRegistry())
    release = threading.Event()
    rounds: list[tuple[float, dict[str, Snapshot]]] = []
    raw: list[list[Snapshot]] = []

    def on_round(snaps: list[Snapshot]) -> None:
        rounds.append((time.monotonic(), {s.message["node"]: s for s in snaps}))
        raw.append(snaps)
        if len(rounds) == RELEASE_AFTER:
            release.set()

    with scripted_exporter([(math.inf, PAGE)], release) as slow_url:
        async with ExporterServer({"/metrics": [NODE_A]}) as good:
            good_url = good.url("/metrics")
            targets = [Target("exp-good", (Endpoint(good_url, "node_exporter"),), "cpu"),
                       Target("exp-hang", (Endpoint(slow_url, "node_exporter"),), "cpu")]
            settings = Settings(scrape_interval_s=INTERVAL_S, scrape_timeout_s=10.0)
            with caplog.at_level(logging.INFO, logger="app.bridge.scraper"):
                stats = await run_bridge(settings, targets, scrapes=ROUNDS, publish=False, metrics=metrics,
                                         on_round=on_round)

    assert stats.rounds == ROUNDS
    # the good node is in every round, and its rounds keep the interval (a hung scrape held them 10 s each)
    assert all("exp-good" in snaps for _, snaps in rounds)
    ts = [snaps["exp-good"].message["ts"] for _, snaps in rounds]
    gaps = [b - a for a, b in zip(ts, ts[1:], strict=False)]
    assert max(gaps) < INTERVAL_S + 0.8, gaps  # generous: a loaded 2-core machine
    assert abs(statistics.median(gaps) - INTERVAL_S) < 0.15, gaps
    assert rounds[-1][0] - rounds[0][0] < (ROUNDS - 1) * INTERVAL_S + 2.0
    # the hung node: left out while its scrape hung, published once it answered, then every round again
    missing = [k for k, (_, snaps) in enumerate(rounds) if "exp-hang" not in snaps]
    assert missing[0] == 0 and len(missing) >= RELEASE_AFTER - 1, missing
    assert all("exp-hang" in snaps for _, snaps in rounds[missing[-1] + 1:])
    assert rounds[-1][1]["exp-hang"].message["metrics"] and not rounds[-1][1]["exp-hang"].troubles
    late = metrics.value("rtt_bridge_scrapes_late_total", node="exp-hang", url=slow_url)
    assert late == len(missing), (late, missing)
    assert metrics.value("rtt_bridge_scrapes_late_total", node="exp-good", url=good_url) == 0
    # one request only while it hung: no new scrape of a node whose scrape is under way; the round that publishes
    # the late scrape starts a new one, and publishes it too (after it), so that round has both
    assert metrics.value("rtt_bridge_scrapes_total", node="exp-hang", url=slow_url, result="ok") == \
        ROUNDS - len(missing) + 1
    back_in = raw[missing[-1] + 1]
    assert [s.message["node"] for s in back_in].count("exp-hang") == 2
    first, second = (s for s in back_in if s.message["node"] == "exp-hang")
    assert first.message["ts"] < second.message["ts"]
    # one WARNING when it became late, one INFO line when it was on time again; none per round, no round overran
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    [slow] = [w for w in lines if "exp-hang" in w]
    assert slow.startswith(f"exp-hang: scrape of {slow_url} still under way after 0.3") and slow.endswith(
        "s: the node goes out in the round after its scrape is over, and is not scraped again meanwhile "
        "(RTT_SCRAPE_TIMEOUT_S 10s bounds it); the other nodes keep their 0.4s interval"), slow
    back = [r.getMessage() for r in caplog.records
            if r.levelno == logging.INFO and "within its round" in r.getMessage()]
    assert back == [f"exp-hang: scrape of {slow_url} over within its round again, after {len(missing)} round(s) it "
                    "was late in"]
    assert not any("overran" in w for w in lines), lines
    assert metrics.value("rtt_bridge_ticks_skipped_total") == 0


def page(switches: int) -> bytes:
    """node_exporter's page with ``switches`` context switches and no ``node_time_seconds`` (so that rates are
    over the bridge's own times of the scrapes)."""
    lines = [f"{CTX} {switches}" if line.startswith(CTX + " ") else line
             for line in NODE_A.read_text().splitlines() if not line.startswith("node_time_seconds")]
    return ("\n".join(lines) + "\n").encode()


async def test_a_late_scrape_gives_rates_over_the_real_interval_between_the_scrapes():
    """A scrape over after its round is published in a later one with the time it started at: its rates, and the
    next scrape's, are over the real time between the scrapes, not over one interval."""
    metrics = BridgeMetrics(CollectorRegistry())
    published: list[Snapshot] = []
    replies = [(0.0, page(100_000)), (1.0, page(101_000)), (0.0, page(103_000))]
    with scripted_exporter(replies) as url:
        target = Target("exp-slow", (Endpoint(url, "node_exporter"),), "cpu")
        stats = await run_bridge(Settings(scrape_interval_s=INTERVAL_S, scrape_timeout_s=5.0), [target], scrapes=6,
                                 publish=False, metrics=metrics, on_round=published.extend)
    assert stats.rounds == 6
    assert metrics.value("rtt_bridge_scrapes_late_total", node="exp-slow", url=url) >= 1
    assert metrics.value("rtt_bridge_scrapes_total", node="exp-slow", url=url, result="ok") == len(published) < 6
    switches = [100_000, 101_000] + [103_000] * (len(published) - 2)
    for k in range(1, len(published)):
        a, b = published[k - 1].message, published[k].message
        expected = (switches[k] - switches[k - 1]) / (b["ts"] - a["ts"])
        assert abs(b["metrics"]["context_switches_per_s"] - expected) <= 0.05 * expected + 1.0, (k, b, expected)
    assert abs(published[1].message["metrics"]["context_switches_per_s"] - 1000 / INTERVAL_S) < 0.25 * 1000 / INTERVAL_S
