"""A scrape over after its round goes out at the start of the next round, and that round scrapes the node again:
an exporter answering in 0.8 to 1 interval is published every round (one round late), a hung one every
RTT_SCRAPE_TIMEOUT_S rounded up to the interval -- not every second round, not every timeout plus one interval.
Real HTTP servers (threaded, so a held request never holds the bridge's event loop)."""

from __future__ import annotations

import logging
import math
import time

from bridge_fixtures import NODE_A, ExporterServer
from prometheus_client import CollectorRegistry

from app.bridge.metrics import BridgeMetrics
from app.bridge.scraper import run_bridge
from app.bridge.snapshot import Snapshot
from app.bridge.targets import Endpoint, Target
from app.config import Settings
from tests.unit.bridge.test_bridge_slow_target import PAGE, scripted_exporter

INTERVAL_S = 0.4
ROUNDS = 10


async def test_an_exporter_answering_within_the_interval_is_published_every_round():
    metrics = BridgeMetrics(CollectorRegistry())
    rounds: list[list[Snapshot]] = []
    with scripted_exporter([(0.34, PAGE)]) as url:  # 0.85 of the interval: over the 0.8 wait, within the interval
        target = Target("exp-0.85", (Endpoint(url, "node_exporter"),), "cpu")
        stats = await run_bridge(Settings(scrape_interval_s=INTERVAL_S, scrape_timeout_s=2.0), [target],
                                 scrapes=ROUNDS, publish=False, metrics=metrics, on_round=rounds.append)
    assert stats.rounds == ROUNDS
    published = sum(1 for snaps in rounds if snaps)
    ts = [s.message["ts"] for snaps in rounds for s in snaps]
    assert ts == sorted(ts)  # the late one first in a round with two
    # every round but the first has it (the last waits for all, so it has two); before, every second round
    assert published >= ROUNDS - 2, (published, metrics.value("rtt_bridge_scrapes_late_total", node="exp-0.85",
                                                               url=url))
    assert len(ts) >= ROUNDS - 1


async def test_a_hung_exporter_is_scraped_again_at_the_tick_after_its_failed_scrape():
    """Each scrape of a hung exporter fails at RTT_SCRAPE_TIMEOUT_S (0.5 s) and goes out in the round under way
    then; the next scrape starts at the next tick: one every timeout rounded up to a tick (0.8 s), never back to
    back with the failed one."""
    rounds: list[tuple[float, list[Snapshot]]] = []
    with scripted_exporter([(math.inf, PAGE)]) as url:
        target = Target("exp-hang", (Endpoint(url, "node_exporter"),), "cpu")
        settings = Settings(scrape_interval_s=0.4, scrape_timeout_s=0.5)
        await run_bridge(settings, [target], scrapes=10, publish=False,
                         on_round=lambda snaps: rounds.append((time.time(), snaps)))
    out = [(at, s.message["ts"]) for at, snaps in rounds for s in snaps]
    assert len(out) >= 4, out
    assert all(s.troubles[0].kind == "scrape_failed" for _, snaps in rounds for s in snaps)
    gaps = [round(b - a, 3) for (_, a), (_, b) in zip(out, out[1:], strict=False)]
    assert all(abs(g - 0.8) < 0.1 for g in gaps), gaps  # before: 0.5, the next one started as the last failed


async def test_the_lines_of_a_failing_exporter_clearing_name_its_url_at_info(caplog):
    """An exporter never identified (no declared exporter, no known port) that fails, then answers: the cleared
    line names its URL, at INFO as the other cleared lines."""
    async with ExporterServer({"/m": [404, NODE_A]}) as srv:
        url = srv.url("/m")
        target = Target("w9", (Endpoint(url),))
        with caplog.at_level(logging.INFO, logger="app.bridge.scraper"):
            await run_bridge(Settings(scrape_interval_s=0.05), [target], scrapes=2, publish=False)
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert (logging.WARNING, f"w9: scrape_failed from an exporter not identified yet at {url}: HTTP 404; "
            "withholding cpu, memory, node") in said, said
    assert (logging.INFO, f"w9: the exporter at {url} scrape_failed cleared") in said, said
