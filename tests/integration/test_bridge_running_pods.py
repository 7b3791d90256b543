"""The GPU hang check of the bridge reading the running-pods view from a real Redis, as ``rttsched pods`` writes it."""

from __future__ import annotations

import asyncio
import logging
import uuid
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
    assert seen["gpu-busy"][3].troubles[0].groups == ("gpu",)
    # its GPU exporter is the node's only endpoint: with gpu withheld no metric is left, so every group is stale
    assert seen["gpu-busy"][3].message["metrics"] == {}
    assert seen["gpu-busy"][3].message["stale"] == ["cpu", "gpu", "memory", "node"]
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


@pytest.fixture(scope="module")
def redis_with_password(tmp_path_factory: pytest.TempPathFactory):
    from fault_stack import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis-auth"), persist=False, password="s3cr3t-pw").start()
    try:
        yield server
    finally:
        server.stop()


def test_the_bridge_reads_the_view_with_the_password_of_its_file(redis_with_password, settings_factory, tmp_path,
                                                                caplog) -> None:
    pw = tmp_path / "redis-password"
    pw.write_text("s3cr3t-pw\n")
    s = settings_factory(redis_url=redis_with_password.url, redis_password_file=str(pw),
                         scrape_interval_s=INTERVAL_S, bridge_gpu_apps="gCTF")
    asyncio.run(write_view(s.redis_client_url, CacheKeys(s.topic_prefix)))
    with caplog.at_level(logging.WARNING, logger="app.bridge.running"):
        seen = asyncio.run(rounds(s, BridgeMetrics(CollectorRegistry())))
    assert [[t.kind for t in snap.troubles] for snap in seen["gpu-busy"]][3] == ["gpu_hang"]  # the view was read
    assert not [r for r in caplog.records if "unreadable" in r.getMessage()]


def test_publish_checks_nodes_against_a_redis_with_a_password(redis_with_password, tmp_path, monkeypatch,
                                                              capsys) -> None:
    import json

    from app.cli.main import main
    from app.scheduler.cache import store_features

    pw = tmp_path / "redis-password"
    pw.write_text("s3cr3t-pw\n")
    prefix = "pw-"

    async def features() -> None:
        client = aioredis.from_url(redis_with_password.url, password="s3cr3t-pw")
        try:
            await store_features(client, CacheKeys(prefix), {"node": "worker-1", "ts": 1.0, "features": {}})
        finally:
            await client.aclose()

    asyncio.run(features())
    monkeypatch.setenv("REDIS_URL", redis_with_password.url)
    monkeypatch.setenv("RTT_REDIS_PASSWORD_FILE", str(pw))
    monkeypatch.setenv("RTT_TOPIC_PREFIX", prefix)
    done = {"task_id": "t-1", "app": "gCTF", "node": "worker-1", "submitted_ts": 1.0, "started_ts": 2.0,
            "finished_ts": 5.0, "rtt_ms": 4000.0, "status": "ok"}
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps(done) + "\n" + json.dumps(dict(done, task_id="t-2", node="worker-9")) + "\n")
    assert main(["publish", "task-completions", str(p), "--dry-run"]) == 1
    out, err = capsys.readouterr()
    assert f"{p}:2: unknown_node:" in err and "checked 1 message(s), 1 invalid" in out
    assert "REDIS_URL" not in err  # read, not refused for want of the password


def test_publish_of_a_long_stream_takes_nodes_that_join_while_it_runs(redis_url: str, monkeypatch, capsys) -> None:
    """A node whose metrics arrive after ``publish -`` started: its completions are accepted (the set of nodes
    is read again on a miss), and a node never scraped is still refused."""
    import concurrent.futures
    import io
    import json

    import app.cli.publish as publish
    from app.cli.main import main
    from app.scheduler.cache import store_features

    prefix = f"join{uuid.uuid4().hex[:10]}-"  # a shared REDIS_URL may hold another run's worker-2 under a fixed one
    keys = CacheKeys(prefix)

    async def features(node: str) -> None:
        client = aioredis.from_url(redis_url)
        try:
            await store_features(client, keys, {"node": node, "ts": 1.0, "features": {}})
        finally:
            await client.aclose()

    asyncio.run(features("worker-1"))
    done = {"task_id": "t-1", "app": "gCTF", "node": "worker-1", "submitted_ts": 1.0, "started_ts": 2.0,
            "finished_ts": 5.0, "rtt_ms": 4000.0, "status": "ok"}

    class Stream(io.BytesIO):
        """Two lines; worker-2 gets its node-features between them (publish reads stdin's bytes)."""

        def __iter__(self):
            yield json.dumps(done).encode() + b"\n"
            with concurrent.futures.ThreadPoolExecutor(1) as pool:  # publish's event loop runs this iterator
                pool.submit(asyncio.run, features("worker-2")).result()
            yield json.dumps(dict(done, task_id="t-2", node="worker-2")).encode() + b"\n"
            yield json.dumps(dict(done, task_id="t-3", node="worker-9")).encode() + b"\n"

    async def forget() -> None:  # the node-features this test wrote
        client = aioredis.from_url(redis_url)
        try:
            written = [key async for key in client.scan_iter(match=keys.pattern("features"))]
            if written:
                await client.delete(*written)
        finally:
            await client.aclose()

    monkeypatch.setattr(publish, "NODES_MISS_S", 0.0)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(Stream()))
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("RTT_TOPIC_PREFIX", prefix)
    try:
        assert main(["publish", "task-completions", "-", "--dry-run"]) == 1
    finally:
        asyncio.run(forget())
    out, err = capsys.readouterr()
    assert "<stdin>:3: unknown_node:" in err and "<stdin>:2:" not in err
    assert "checked 2 message(s), 1 invalid" in out
