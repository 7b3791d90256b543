"""The GPU hang check of the bridge reading the running-pods view from a real Redis, as ``rttsched pods`` writes it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from exporter_pages import serve_pages
from prometheus_client import CollectorRegistry

from app.bridge.metrics import BridgeMetrics
from app.bridge.scraper import run_bridge
from app.bridge.targets import Endpoint, Target
from app.clock import ManualClock
from app.config import Settings
from app.scheduler.cache import CacheKeys, store_running

pytestmark = pytest.mark.integration

EXPORTERS = Path(__file__).resolve().parents[1] / "fixtures" / "exporters"
IDLE_LOOKING = (EXPORTERS / "dcgm-exporter-3.3.5.rtx4090.watchdog.prom").read_text()  # util, copy util, FB 0
INTERVAL_S = 10.0


async def rounds(settings: Settings, metrics: BridgeMetrics) -> dict[str, list]:
    clock = ManualClock(1_796_208_576.0)

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)
        await asyncio.sleep(0)

    seen: dict[str, list] = {"gpu-busy": [], "gpu-idle": []}
    async with serve_pages({"/busy": [IDLE_LOOKING], "/idle": [IDLE_LOOKING]}) as urls:
        targets = [Target("gpu-busy", (Endpoint(urls["/busy"], "dcgm_exporter"),)),
                   Target("gpu-idle", (Endpoint(urls["/idle"], "dcgm_exporter"),))]

        def keep(snaps):
            for snap in snaps:
                seen[snap.message["node"]].append(snap)

        await run_bridge(settings, targets, scrapes=5, clock=clock, sleep=sleep, publish=False, metrics=metrics,
                         on_round=keep)
    return seen


async def write_view(url: str, keys: CacheKeys) -> None:
    client = aioredis.from_url(url)
    try:
        await store_running(client, keys, "gpu-busy", {"gCTF": 1, "upload": 2}, 1.0)
        await store_running(client, keys, "gpu-idle", {"upload": 3}, 1.0)
    finally:
        await client.aclose()


def test_pods_of_gpu_apps_on_a_flat_gpu_mark_it_hung(redis_url: str, settings_factory) -> None:
    s = settings_factory(redis_url=redis_url, scrape_interval_s=INTERVAL_S, bridge_gpu_apps="gCTF,Motioncor2")
    asyncio.run(write_view(redis_url, CacheKeys(s.topic_prefix)))
    metrics = BridgeMetrics(CollectorRegistry())
    seen = asyncio.run(rounds(s, metrics))
    busy = [[t.kind for t in snap.troubles] for snap in seen["gpu-busy"]]
    assert busy == [[], [], [], ["gpu_hang"], ["gpu_hang"]]  # flat from 0 s; 30 s at the fourth round
    assert seen["gpu-busy"][3].message["stale"] == ["gpu"]
    assert "1 pod(s) of GPU apps" in seen["gpu-busy"][3].troubles[0].detail
    assert len(seen["gpu-idle"]) == 5
    assert all(snap.troubles == () for snap in seen["gpu-idle"])  # only upload pods: not GPU apps
    assert metrics.value("rtt_bridge_exporter_trouble_total", node="gpu-busy", exporter="dcgm_exporter",
                         kind="gpu_hang") == 2


def test_an_unreachable_redis_leaves_the_check_to_the_exporters(settings_factory, caplog) -> None:
    from app.kafka.embedded import free_port

    s = settings_factory(redis_url=f"redis://127.0.0.1:{free_port()}/0", scrape_interval_s=INTERVAL_S)
    with caplog.at_level(logging.WARNING, logger="app.bridge.running"):
        seen = asyncio.run(rounds(s, BridgeMetrics(CollectorRegistry())))
    assert len(seen["gpu-busy"]) == 5  # every round scraped and published
    assert all(snap.troubles == () and snap.message["metrics"] and snap.message["stale"] == []
               for snap in seen["gpu-busy"])  # the same flat GPU that is hung with the view is not without it
    unreadable = [r for r in caplog.records if "running-pods view unreadable from Redis" in r.getMessage()]
    assert len(unreadable) == 1  # the failure happened, was logged once, and raised nothing
