"""The scrape loop against a real local HTTP server (no broker: publish=False)."""

from __future__ import annotations

import asyncio

import pytest
from bridge_fixtures import DCGM_A, DCGM_B, GAP_S, NODE_A, NODE_B, ExporterServer, raw_sum
from prometheus_client import CollectorRegistry

from app.bridge.errors import TargetError
from app.bridge.metrics import BridgeMetrics
from app.bridge.scraper import run_bridge
from app.bridge.targets import Endpoint, Target
from app.clock import ManualClock
from app.config import Settings


def manual() -> tuple[ManualClock, object]:
    clock = ManualClock(1_796_208_576.0)

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)
        await asyncio.sleep(0)

    return clock, sleep


async def test_two_rounds_give_rates_and_count_scrapes():
    metrics = BridgeMetrics(CollectorRegistry())
    rounds = []
    clock, sleep = manual()
    async with ExporterServer({"/node": [NODE_A, NODE_B], "/dcgm": [DCGM_A, DCGM_B]}) as srv:
        target = Target("worker-3", (Endpoint(srv.url("/node"), "node_exporter"),
                                     Endpoint(srv.url("/dcgm"), "dcgm_exporter")))
        stats = await run_bridge(Settings(scrape_interval_s=GAP_S), [target], scrapes=2, clock=clock, sleep=sleep,
                                 publish=False, metrics=metrics, on_round=rounds.append)
    assert stats.rounds == 2 and stats.failed_scrapes == 0
    [second] = rounds[1]
    m = second.message["metrics"]
    assert second.message["ts"] == 1_796_208_576.0 + GAP_S
    assert m["memory_cached_bytes"] == raw_sum(NODE_B, "node_memory_Cached_bytes")
    assert m["nvidia_smi_memory_used"] == raw_sum(DCGM_B, "DCGM_FI_DEV_FB_USED") * 2**20
    assert "cpu_iowait" in m and "cpu_iowait" not in rounds[0][0].message["metrics"]
    assert metrics.value("rtt_bridge_scrapes_total", node="worker-3", url=target.urls[0], result="ok") == 2
    assert metrics.value("rtt_bridge_scrape_duration_seconds_count") == 4
    assert metrics.value("rtt_bridge_samples_dropped_total", exporter="dcgm_exporter") == 0


async def test_clamped_and_rejected_readings_are_counted_by_metric():
    from bridge_fixtures import with_value

    metrics = BridgeMetrics(CollectorRegistry())
    clock, sleep = manual()
    pressure = "node_pressure_cpu_waiting_seconds_total"
    dt = raw_sum(NODE_B, "node_time_seconds") - raw_sum(NODE_A, "node_time_seconds")
    saturated = with_value(NODE_B.read_text(), pressure, raw_sum(NODE_A, pressure) + 1.01 * dt)
    far = with_value(saturated, "node_time_seconds", raw_sum(NODE_B, "node_time_seconds") + dt)
    far = with_value(far, pressure, raw_sum(NODE_A, pressure) + 1.01 * dt + 3.0 * dt)
    async with ExporterServer({"/node": [NODE_A, saturated, far]}) as srv:
        target = Target("worker-3", (Endpoint(srv.url("/node"), "node_exporter"),))
        await run_bridge(Settings(scrape_interval_s=GAP_S), [target], scrapes=3, clock=clock, sleep=sleep,
                         publish=False, metrics=metrics)
    assert metrics.value("rtt_bridge_values_clamped_total", metric="cpu_pressure_waiting") == 1
    assert metrics.value("rtt_bridge_values_rejected_total", metric="cpu_pressure_waiting") == 1


async def test_timeouts_and_http_errors_are_counted_as_trouble():
    metrics = BridgeMetrics(CollectorRegistry())
    rounds = []
    clock, sleep = manual()
    async with ExporterServer({"/node": [NODE_A, 500], "/dcgm": [DCGM_A, 1.5]}) as srv:
        target = Target("worker-3", (Endpoint(srv.url("/node")), Endpoint(srv.url("/dcgm"))))
        settings = Settings(scrape_interval_s=1.0, scrape_timeout_s=0.3)
        stats = await run_bridge(settings, [target], scrapes=2, clock=clock, sleep=sleep, publish=False,
                                 metrics=metrics, on_round=rounds.append)
    [second] = rounds[1]
    assert stats.failed_scrapes == 2
    details = {t.exporter: (t.kind, t.detail) for t in second.troubles}
    assert details == {"node_exporter": ("scrape_failed", "HTTP 500"),
                       "dcgm_exporter": ("scrape_failed", "timeout after 0.3s")}
    assert second.message["stale"] == ["cpu", "gpu", "memory", "node"]
    assert metrics.value("rtt_bridge_exporter_trouble_total", node="worker-3", exporter="dcgm_exporter",
                         kind="scrape_failed") == 1
    assert metrics.value("rtt_bridge_scrapes_total", node="worker-3", url=target.urls[1], result="failed") == 1


async def test_an_unreachable_endpoint_is_a_failed_scrape_not_an_exception():
    from app.kafka.embedded import free_port

    url = f"http://127.0.0.1:{free_port()}/metrics"
    rounds = []
    clock, sleep = manual()
    await run_bridge(Settings(), [Target("w", (Endpoint(url),))], scrapes=1, clock=clock, sleep=sleep,
                     publish=False, metrics=BridgeMetrics(CollectorRegistry()), on_round=rounds.append)
    [[snap]] = rounds
    assert snap.troubles[0].kind == "scrape_failed" and "ClientConnector" in snap.troubles[0].detail


LANDING = "<html><head><title>Node Exporter</title></head><body><a href='/metrics'>Metrics</a></body></html>"


async def test_a_page_without_any_metric_read_is_counted_as_a_failed_scrape():
    metrics = BridgeMetrics(CollectorRegistry())
    rounds = []
    clock, sleep = manual()
    async with ExporterServer({"/": [LANDING], "/empty": [""], "/dcgm": [DCGM_A, DCGM_B]}) as srv:
        target = Target("worker-3", (Endpoint(srv.url("/"), "node_exporter"), Endpoint(srv.url("/empty")),
                                     Endpoint(srv.url("/dcgm"), "dcgm_exporter")))
        stats = await run_bridge(Settings(scrape_interval_s=GAP_S), [target], scrapes=2, clock=clock, sleep=sleep,
                                 publish=False, metrics=metrics, on_round=rounds.append)
    assert stats.failed_scrapes == 4  # two endpoints, two rounds
    [second] = rounds[1]
    assert sorted((t.exporter, t.kind) for t in second.troubles) == [("node_exporter", "scrape_failed"),
                                                                       ("unknown", "scrape_failed")]
    assert second.message["stale"] == ["cpu", "gpu", "memory", "node"] and second.message["metrics"] == {}
    for url in target.urls[:2]:
        assert metrics.value("rtt_bridge_scrapes_total", node="worker-3", url=url, result="failed") == 2
        assert metrics.value("rtt_bridge_scrapes_total", node="worker-3", url=url, result="ok") == 0
    assert metrics.value("rtt_bridge_scrapes_total", node="worker-3", url=target.urls[2], result="ok") == 2
    assert metrics.value("rtt_bridge_exporter_trouble_total", node="worker-3", exporter="node_exporter",
                         kind="scrape_failed") == 2


async def test_a_declared_exporter_the_mapping_does_not_know_is_refused():
    target = Target("w", (Endpoint("http://127.0.0.1:9/metrics", "dcgm"),))
    with pytest.raises(TargetError, match="unknown exporter 'dcgm' .known: node_exporter, dcgm_exporter"):
        await run_bridge(Settings(), [target], scrapes=1, publish=False, metrics=BridgeMetrics(CollectorRegistry()))
