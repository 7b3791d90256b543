"""The foundation end to end: exporter pages over HTTP -> bridge -> node-metrics -> worker -> node-features.

A local HTTP server serves the real node_exporter 1.5.0 captures (8.4 s apart by ``node_time_seconds``)
and the dcgm-exporter captures of the same node; the real bridge scrapes them three times on a manual
clock (8.4 s per round) and publishes to the embedded broker; the real worker (``rttsched worker``, a
subprocess) turns node-metrics into node-features. Between the first and the second round a malformed
message is put on the node's partition: it must reach dead-letters and the rounds after it must still
count. Expected values are computed here from the exposition text, never by the bridge's code.

The two real captures have no iowait between them (Δiowait = 0 on both CPUs), so the third page is the
second one advanced by known per-CPU deltas, iowait included: ``cpu_iowait`` is then 0 for one interval
and > 0 for the next, which checks ``__last``, ``__mean``, ``__min`` and ``__max`` against distinct values.
"""

from __future__ import annotations

import asyncio
import base64
import statistics
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from exporter_pages import advance_cpu, cpu_share, read_until, serve_pages

from app.bridge.scraper import run_bridge
from app.bridge.targets import Endpoint, Target
from app.cli.processes import ProcessGroup
from app.clock import ManualClock
from app.config import Settings
from app.contracts import decode
from app.sim.scripted import samples, start_worker

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NODE_A, NODE_B = (REPO / "tests" / "fixtures" / "exporters" / f"node_exporter-1.5.0.scrape-{x}.prom"
                  for x in "ab")
DCGM_A, DCGM_B = (REPO / "tests" / "fixtures" / "exporters" / f"dcgm-exporter-3.3.5.rtx4090.scrape-{x}.prom"
                  for x in "ab")
GAP_S = 8.4  # between the captures, and the bridge's interval here
START_TS = 1_796_208_576.0  # the first capture's node_time_seconds, whole seconds
NODE = "worker-3"
WINDOW_S = 30.0  # holds all three rounds
# per (cpu, mode), seconds accrued in the third interval: ~8.4 s per CPU, iowait on both
DELTAS = {("0", "idle"): 5.9, ("0", "iowait"): 1.7, ("0", "system"): 0.35, ("0", "user"): 0.44,
          ("0", "softirq"): 0.01, ("1", "idle"): 7.3, ("1", "iowait"): 0.25, ("1", "user"): 0.83,
          ("1", "system"): 0.02}
MALFORMED = b'{"node": "worker-3", "ts": 1796208580.0, "node_class": "gpu", "metrics": {"cpu_iowait": 0.'
CPU_MODES = {"cpu_iowait": "iowait", "cpu_usage_system": "system", "cpu_usage_user": "user", "cpu_idle": "idle",
             "cpu_steal": "steal"}


def node_pages() -> list[str]:
    a, b = NODE_A.read_text(), NODE_B.read_text()
    return [a, b, advance_cpu(b, DELTAS, GAP_S)]


def dcgm_pages() -> list[str]:
    a, b = DCGM_A.read_text(), DCGM_B.read_text()
    return [a, b, b]  # an unchanged third page, as an exporter between two DCGM updates


def expected_series() -> dict[str, list[float]]:
    """Each canonical metric's value per round (a rate has none in the first round), from the text alone."""
    nodes, dcgm = node_pages(), dcgm_pages()
    out: dict[str, list[float]] = {}
    for name, mode in CPU_MODES.items():
        out[name] = [cpu_share(nodes[i], nodes[i + 1], mode) for i in range(2)]
    out["memory_cache_usage"] = [samples(t, "node_memory_Cached_bytes")[0] / samples(t, "node_memory_MemTotal_bytes")[0]
                                 for t in nodes]
    out["nvidia_smi_utilization_gpu"] = [statistics.fmean(samples(t, "DCGM_FI_DEV_GPU_UTIL")) / 100 for t in dcgm]
    out["nvidia_smi_memory_used"] = [sum(samples(t, "DCGM_FI_DEV_FB_USED")) * 2**20 for t in dcgm]
    return out


async def bridge_rounds(s: Settings, bad: bytes) -> None:
    """Three bridge rounds on a manual clock; ``bad`` is produced on the node's partition after the first."""
    clock = ManualClock(START_TS)
    producer = AIOKafkaProducer(bootstrap_servers=s.bootstrap_servers)
    await producer.start()
    rounds_slept = 0

    async def sleep(seconds: float) -> None:
        nonlocal rounds_slept
        if rounds_slept == 0:
            await producer.send_and_wait(s.topic("node-metrics"), bad, key=NODE.encode())
        rounds_slept += 1
        clock.advance(seconds)

    try:
        async with serve_pages({"/node/metrics": node_pages(), "/dcgm/metrics": dcgm_pages()}) as urls:
            target = Target(NODE, (Endpoint(urls["/node/metrics"], "node_exporter"),
                                   Endpoint(urls["/dcgm/metrics"], "dcgm_exporter")))
            stats = await run_bridge(s, [target], scrapes=3, clock=clock, sleep=sleep, producer=producer)
    finally:
        await producer.stop()
    assert (stats.rounds, stats.messages, stats.failed_scrapes) == (3, 3, 0)


def check_window(features: dict[str, float], name: str, values: list[float]) -> None:
    got = {agg: features[f"{name}__{agg}"] for agg in ("last", "mean", "min", "max", "std")}
    want = {"last": values[-1], "mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "std": statistics.pstdev(values)}
    assert got == pytest.approx(want, abs=1e-9, rel=1e-12), name


def test_exporters_to_node_features(kafka_settings: Settings, tmp_path: Path) -> None:
    s = Settings.from_env({}, kafka_bootstrap=kafka_settings.kafka_bootstrap,
                          topic_prefix=kafka_settings.topic_prefix, scrape_interval_s=GAP_S)
    want = expected_series()
    assert want["cpu_iowait"][0] == 0.0 and want["cpu_iowait"][1] > 0.01  # the test data is what it claims

    with ProcessGroup(tmp_path) as group:
        # the captures keep the time they were recorded at: a day later the worker's admission would call
        # them too old (ts_too_old), so it is told to accept their age
        age = str(max(86_400.0, time.time() - START_TS + 86_400.0))
        url = start_worker(group, s, RTT_FEATURE_WINDOW_S=str(WINDOW_S), RTT_FEATURE_EMIT_INTERVAL_S="0.2",
                           RTT_MAX_EVENT_AGE_S=age)
        asyncio.run(bridge_rounds(s, MALFORMED))

        def final(records: list[Any]) -> bool:
            return any(orjson.loads(r.value)["count"] == 3 for r in records if r.key == NODE.encode())

        features_records = asyncio.run(read_until(s, "node-features", final, timeout_s=40))
        metrics_records = asyncio.run(read_until(s, "node-metrics", lambda r: len(r) >= 4))
        [letter] = asyncio.run(read_until(s, "dead-letters", lambda r: len(r) >= 1))
        deadline = time.monotonic() + 10  # messages in are counted once the checkpoint holding them is stored
        while True:
            page = urllib.request.urlopen(url, timeout=5).read().decode()  # noqa: S310 - loopback
            if 'rtt_worker_messages_in_total{topic="node-metrics"} 4.0' in page or time.monotonic() > deadline:
                break
            time.sleep(0.2)

    # node-metrics: the node's partition holds round 1, the malformed message, rounds 2 and 3, in that order
    assert {r.partition for r in metrics_records} == {metrics_records[0].partition}
    ordered = sorted(metrics_records, key=lambda r: r.offset)
    assert [r.offset for r in ordered] == [0, 1, 2, 3] and ordered[1].value == MALFORMED
    rounds = [decode("node-metrics", r.value, strict=True) for r in (ordered[0], ordered[2], ordered[3])]
    assert [m["ts"] for m in rounds] == pytest.approx([START_TS, START_TS + GAP_S, START_TS + 2 * GAP_S], abs=1e-6)
    assert "cpu_iowait" not in rounds[0]["metrics"]  # a rate needs two scrapes

    # dead-letters: the malformed message, where it was, why, and its bytes
    dead = decode("dead-letters", letter.value, strict=True)
    assert (dead["topic"], dead["partition"], dead["offset"], dead["reason"], dead["key"]) == (
        s.topic("node-metrics"), ordered[1].partition, 1, "invalid_json", NODE)
    assert base64.b64decode(dead["raw"]) == MALFORMED

    # node-features: the last value of the node covers all three rounds
    mine = [decode("node-features", r.value, strict=True) for r in sorted(features_records, key=lambda r: r.offset)
            if r.key == NODE.encode()]
    last = mine[-1]
    assert last["count"] == 3 and last["ts"] == rounds[2]["ts"] and last["window_s"] == WINDOW_S
    assert (last["node"], last["node_class"], last["gpu_model"], last["stale"]) == (
        NODE, "gpu", "NVIDIA GeForce RTX 4090", [])
    f = last["features"]
    assert f["cpu_iowait__last"] == pytest.approx(want["cpu_iowait"][-1], abs=1e-9)
    assert f["cpu_iowait__mean"] == pytest.approx(want["cpu_iowait"][-1] / 2, abs=1e-9)
    for name, values in want.items():
        check_window(f, name, values)
    assert 0.9 < f["nvidia_smi_utilization_gpu__last"] <= 1.0  # a fraction, not a percentage

    assert 'rtt_worker_dead_letters_total{reason="invalid_json",topic="node-metrics"} 1.0' in page
    assert 'rtt_worker_messages_in_total{topic="node-metrics"} 4.0' in page
