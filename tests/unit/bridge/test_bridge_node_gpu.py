"""``rtt_bridge_node_gpu``: whether the bridge reads a node as a GPU node, for the alert that compares it with
the node's GPU capacity (a GPU exporter the bridge cannot reach leaves a GPU node read as a CPU node)."""

from __future__ import annotations

from bridge_fixtures import DCGM_A, NODE_A, ExporterServer
from prometheus_client import CollectorRegistry

from app.bridge.metrics import BridgeMetrics
from app.bridge.scraper import run_bridge
from app.bridge.targets import Endpoint, Target
from app.clock import ManualClock
from app.config import Settings


async def test_a_node_whose_gpu_exporter_answers_is_1_one_whose_gpu_exporter_never_answers_is_0() -> None:
    metrics = BridgeMetrics(CollectorRegistry())
    clock = ManualClock(1_796_208_576.0)

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)

    node, dcgm = NODE_A.read_text(), DCGM_A.read_text()
    async with ExporterServer({"/node": [node] * 3, "/dcgm": [dcgm] * 3}) as srv:
        unreachable = "http://127.0.0.1:1/metrics"  # nothing listens: an exporter on the pod network only
        targets = [Target("gpu-1", (Endpoint(srv.url("/node"), "node_exporter"),
                                    Endpoint(srv.url("/dcgm"), "dcgm_exporter", optional=True))),
                   Target("gpu-2", (Endpoint(srv.url("/node"), "node_exporter"),
                                    Endpoint(unreachable, "dcgm_exporter", optional=True)))]
        await run_bridge(Settings(scrape_interval_s=10.0), targets, scrapes=3, clock=clock, sleep=sleep,
                         publish=False, metrics=metrics)
    assert metrics.value("rtt_bridge_node_gpu", node="gpu-1") == 1.0
    assert metrics.registry.get_sample_value("rtt_bridge_node_gpu", {"node": "gpu-2"}) == 0.0
