"""The bridge against the real embedded broker: exporters served over HTTP -> node-metrics; publish -> topics.

``serve_captures`` and :func:`app.bridge.scraper.run_bridge` are the pieces an end-to-end test builds on:

    async with serve_captures() as urls:
        await run_bridge(settings, [capture_target(urls)], scrapes=2, clock=clock, sleep=sleep)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from exporter_pages import serve_pages
from prometheus_client import CollectorRegistry

from app.bridge.metrics import BridgeMetrics
from app.bridge.otlp import otlp_to_completions
from app.bridge.producer import publish
from app.bridge.scraper import run_bridge
from app.bridge.targets import Endpoint, Target
from app.cli.main import main
from app.clock import ManualClock
from app.config import Settings
from app.contracts import decode
from app.kafka.admin import ensure_topics
from app.kafka.client import client_options
from app.kafka.embedded import EmbeddedBroker

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO / "tests" / "fixtures" / "exporters"
FIXTURES = REPO / "tests" / "fixtures"
NODE_CAPTURES = [SHARED / "node_exporter-1.5.0.scrape-a.prom", SHARED / "node_exporter-1.5.0.scrape-b.prom"]
DCGM_CAPTURES = [FIXTURES / "exporters" / "dcgm-exporter-3.3.5.rtx4090.scrape-a.prom",
                 FIXTURES / "exporters" / "dcgm-exporter-3.3.5.rtx4090.scrape-b.prom"]
GAP_S = 8.4  # between the captures


@contextlib.asynccontextmanager
async def serve_captures(routes: dict[str, list[Path]] | None = None) -> AsyncIterator[dict[str, str]]:
    """An HTTP server on a free port serving each path's captures in turn (the last one repeats)."""
    routes = routes or {"/node/metrics": NODE_CAPTURES, "/dcgm/metrics": DCGM_CAPTURES}
    async with serve_pages({p: [f.read_text() for f in files] for p, files in routes.items()}) as urls:
        yield urls


def capture_target(urls: dict[str, str], node: str = "worker-3") -> Target:
    return Target(node, (Endpoint(urls["/node/metrics"], "node_exporter"),
                         Endpoint(urls["/dcgm/metrics"], "dcgm_exporter")))


def manual_clock(start: float = 1_796_208_576.0) -> tuple[ManualClock, Any]:
    clock = ManualClock(start)

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)
        await asyncio.sleep(0)

    return clock, sleep


async def consume(s: Settings, topic: str, n: int, timeout_s: float = 20.0) -> list[Any]:
    """The first ``n`` records of ``topic`` (every partition, from the beginning)."""
    c = AIOKafkaConsumer(s.topic(topic), bootstrap_servers=s.bootstrap_servers, auto_offset_reset="earliest",
                         enable_auto_commit=False)
    await c.start()
    out: list[Any] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(out) < n:
            assert time.monotonic() < deadline, f"{topic}: got {len(out)} of {n} records"
            batch = await c.getmany(timeout_ms=500)
            out.extend(m for msgs in batch.values() for m in msgs)
        return sorted(out, key=lambda m: (m.timestamp, m.offset))
    finally:
        await c.stop()


def raw(path: Path, name: str, **labels: str) -> float:
    """Sum of a metric's samples straight from the text (independent of the bridge's parser)."""
    total = 0.0
    for line in path.read_text().splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})?\s+(\S+)", line)
        if m and m.group(1) == name:
            have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(have.get(k) == v for k, v in labels.items()):
                total += float(m.group(3))
    return total


def share(mode: str) -> float:
    a, b = NODE_CAPTURES
    modes = ("idle", "iowait", "irq", "nice", "softirq", "steal", "system", "user")
    d = {m: raw(b, "node_cpu_seconds_total", mode=m) - raw(a, "node_cpu_seconds_total", mode=m) for m in modes}
    return d[mode] / sum(d.values())


async def test_bridge_scrapes_exporters_into_node_metrics(kafka_settings):
    s = Settings.from_env({}, kafka_bootstrap=kafka_settings.kafka_bootstrap,
                          topic_prefix=kafka_settings.topic_prefix, scrape_interval_s=GAP_S)
    clock, sleep = manual_clock()
    metrics = BridgeMetrics(CollectorRegistry())
    async with serve_captures() as urls:
        stats = await run_bridge(s, [capture_target(urls)], scrapes=2, clock=clock, sleep=sleep, metrics=metrics)
    assert stats.messages == 2
    records = await consume(s, "node-metrics", 2)
    assert [r.key for r in records] == [b"worker-3", b"worker-3"]
    assert records[0].partition == records[1].partition
    first, second = (decode("node-metrics", r.value, strict=True) for r in records)
    assert first["ts"] + GAP_S == second["ts"]
    assert "cpu_iowait" not in first["metrics"]  # no rate before the second scrape
    m = second["metrics"]
    assert m["cpu_iowait"] == pytest.approx(share("iowait"), abs=1e-9)
    assert m["cpu_usage_system"] == pytest.approx(share("system"), abs=1e-9)
    assert m["memory_cache_usage"] == pytest.approx(
        raw(NODE_CAPTURES[1], "node_memory_Cached_bytes") / raw(NODE_CAPTURES[1], "node_memory_MemTotal_bytes"))
    assert m["gpu_power_w"] == raw(DCGM_CAPTURES[1], "DCGM_FI_DEV_POWER_USAGE")  # gpu 1's reading was blank
    assert m["gpu_memory_total_bytes"] == (raw(DCGM_CAPTURES[1], "DCGM_FI_DEV_FB_USED")
                                           + raw(DCGM_CAPTURES[1], "DCGM_FI_DEV_FB_FREE")) * 2**20
    assert second["node_class"] == "gpu" and second["gpu_model"] == "NVIDIA GeForce RTX 4090"
    assert second["stale"] == []
    assert metrics.value("rtt_bridge_messages_total", topic=s.topic("node-metrics")) == 2


async def test_publish_completions_keys_by_node(kafka_settings):
    batch = otlp_to_completions(json.loads((FIXTURES / "spans" / "otlp-export.json").read_text()))
    producer = AIOKafkaProducer(bootstrap_servers=kafka_settings.bootstrap_servers)
    await producer.start()
    try:
        assert await publish(producer, kafka_settings, "task-completions", batch.completions) == 2
    finally:
        await producer.stop()
    records = await consume(kafka_settings, "task-completions", 2)
    got = {r.key.decode(): decode("task-completions", r.value, strict=True) for r in records}
    assert got == {c["node"]: c for c in batch.completions}


def test_publish_cli_sends_valid_lines_and_dead_letters_the_rest(kafka_settings, tmp_path, monkeypatch, capsys):
    good = {"task_id": "t-9", "app": "upload", "node": "worker-1", "submitted_ts": 10.0, "started_ts": 11.0,
            "finished_ts": 13.5, "rtt_ms": 3500.0, "status": "ok"}
    bad = '{"task_id": "t-10", "app": "upload"}'
    p = tmp_path / "completions.jsonl"
    p.write_text(json.dumps(good) + "\n" + bad + "\n")
    monkeypatch.setenv("RTT_KAFKA_BOOTSTRAP", kafka_settings.kafka_bootstrap)
    monkeypatch.setenv("RTT_TOPIC_PREFIX", kafka_settings.topic_prefix)
    assert main(["publish", "task-completions", str(p), "--dead-letters"]) == 1
    out, err = capsys.readouterr()
    assert f"{p}:2: schema:" in err and "published" in out and "(sent to dead-letters)" in out

    [completion] = asyncio.run(consume(kafka_settings, "task-completions", 1))
    assert completion.key == b"worker-1" and decode("task-completions", completion.value, strict=True) == good
    [letter] = asyncio.run(consume(kafka_settings, "dead-letters", 1))
    dl = decode("dead-letters", letter.value, strict=True)
    assert letter.key == kafka_settings.topic("task-completions").encode()
    assert (dl["topic"], dl["partition"], dl["offset"], dl["reason"]) == (
        kafka_settings.topic("task-completions"), -1, 2, "schema")
    assert base64.b64decode(dl["raw"]).decode() == bad


def test_publish_cli_dead_letters_a_line_that_is_not_utf8_and_publishes_the_lines_after_it(
        kafka_settings, tmp_path, monkeypatch, capsys):
    good = {"task_id": "t-11", "app": "upload", "node": "worker-1", "submitted_ts": 10.0, "started_ts": 11.0,
            "finished_ts": 13.5, "rtt_ms": 3500.0, "status": "ok"}
    bad = b'{"task_id": "t-\xff"}'
    p = tmp_path / "completions.jsonl"
    p.write_bytes(bad + b"\n" + json.dumps(good).encode() + b"\n")
    monkeypatch.setenv("RTT_KAFKA_BOOTSTRAP", kafka_settings.kafka_bootstrap)
    monkeypatch.setenv("RTT_TOPIC_PREFIX", kafka_settings.topic_prefix)
    assert main(["publish", "task-completions", str(p), "--dead-letters"]) == 1
    out, err = capsys.readouterr()
    assert f"{p}:1: invalid_json: not UTF-8" in err and "Traceback" not in err
    assert "1 message(s), 1 invalid record(s) (sent to dead-letters)" in out

    [completion] = asyncio.run(consume(kafka_settings, "task-completions", 1))
    assert decode("task-completions", completion.value, strict=True) == good
    [letter] = asyncio.run(consume(kafka_settings, "dead-letters", 1))
    dl = decode("dead-letters", letter.value, strict=True)
    assert (dl["offset"], dl["reason"]) == (1, "invalid_json") and base64.b64decode(dl["raw"]) == bad


def test_publish_cli_sends_what_it_read_when_reading_stops_early(kafka_settings, tmp_path, monkeypatch, capsys):
    import app.bridge.records as records

    good = {"task_id": "t-12", "app": "upload", "node": "worker-1", "submitted_ts": 10.0, "started_ts": 11.0,
            "finished_ts": 13.5, "rtt_ms": 3500.0, "status": "ok"}
    read = records.read_records

    def then_fail(stream):
        yield from read(stream)
        raise OSError("Input/output error")  # a disk that went away under a long file

    monkeypatch.setattr(records, "read_records", then_fail)
    p = tmp_path / "completions.jsonl"
    p.write_text(json.dumps(good) + "\n")
    monkeypatch.setenv("RTT_KAFKA_BOOTSTRAP", kafka_settings.kafka_bootstrap)
    monkeypatch.setenv("RTT_TOPIC_PREFIX", kafka_settings.topic_prefix)
    assert main(["publish", "task-completions", str(p)]) == 1
    assert "Input/output error" in capsys.readouterr().err
    [completion] = asyncio.run(consume(kafka_settings, "task-completions", 1))
    assert decode("task-completions", completion.value, strict=True) == good


def test_a_completion_on_a_node_without_metrics_is_dead_lettered_with_its_reason(kafka_settings, tmp_path,
                                                                                  monkeypatch, capsys):
    targets = tmp_path / "targets.yaml"
    targets.write_text("nodes:\n  - {node: worker-1, targets: ['http://10.0.0.11:9100/metrics']}\n")
    spans = FIXTURES / "spans" / "otlp-export-base64.json"  # its node is only a pod name in host.name
    monkeypatch.setenv("RTT_KAFKA_BOOTSTRAP", kafka_settings.kafka_bootstrap)
    monkeypatch.setenv("RTT_TOPIC_PREFIX", kafka_settings.topic_prefix)
    assert main(["publish", "task-completions", str(spans), "--from", "otlp", "--targets", str(targets),
                 "--dead-letters"]) == 1
    assert "unknown_node" in capsys.readouterr().err
    [letter] = asyncio.run(consume(kafka_settings, "dead-letters", 1))
    dl = decode("dead-letters", letter.value, strict=True)
    assert dl["reason"] == "unknown_node" and "gctf-runner-5d4c7b9f8-q8w3e" in dl["error"]
    assert json.loads(base64.b64decode(dl["raw"])) == json.loads(spans.read_text())


async def test_bridge_keeps_scraping_while_the_broker_is_away(settings_factory):
    """The broker goes away under a running bridge: each round the broker does not take is dropped and counted,
    scraping goes on (the bridge used to exit once its producer gave up on a round), and node-metrics are
    produced again once the broker is back."""
    broker = await asyncio.to_thread(EmbeddedBroker().start)
    s = settings_factory(kafka_bootstrap=broker.bootstrap, scrape_interval_s=0.5)
    metrics = BridgeMetrics(CollectorRegistry())
    name = s.topic("node-metrics")

    async def until(check, what: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.1)

    try:
        await ensure_topics(s)
        producer = AIOKafkaProducer(**client_options(s, request_timeout_ms=1500, linger_ms=5))
        await producer.start()
        try:
            async with serve_captures() as urls:
                task = asyncio.ensure_future(run_bridge(s, [capture_target(urls)], producer=producer,
                                                        metrics=metrics))
                await until(lambda: metrics.value("rtt_bridge_messages_total", topic=name) >= 1, "a first round")
                broker.kill()
                await until(lambda: metrics.value("rtt_bridge_rounds_unpublished_total", topic="node-metrics") >= 2
                            or task.done(), "two rounds dropped")
                assert not task.done(), task.exception()
                await asyncio.to_thread(broker.start)
                await ensure_topics(s)
                sent = metrics.value("rtt_bridge_messages_total", topic=name)
                await until(lambda: metrics.value("rtt_bridge_messages_total", topic=name) > sent or task.done(),
                            "node-metrics produced again")
                assert not task.done(), task.exception()
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        finally:
            await producer.stop()
        assert len(await consume(s, "node-metrics", 1)) == 1  # in the topic the restarted broker holds
    finally:
        broker.stop()
