"""The worker on the real embedded broker, as a subprocess: features, dead letters, restart."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from app.cli.processes import ProcessGroup
from app.config import Settings
from app.kafka.embedded import free_port

pytestmark = pytest.mark.integration


def start_worker(group: ProcessGroup, s: Settings, name: str = "worker") -> str:
    port = free_port()
    group.start(name, ["worker", "--session-timeout-s", "6", "--datadir", str(group.log_dir / "faust")], env={
        "RTT_KAFKA_BOOTSTRAP": s.bootstrap_servers, "RTT_TOPIC_PREFIX": s.topic_prefix,
        "RTT_METRICS_PORT": str(port), "RTT_FEATURE_EMIT_INTERVAL_S": "0.2",
    })
    url = f"http://127.0.0.1:{port}/metrics"
    group.wait_http(name, url.replace("/metrics", "/readyz"), timeout_s=30)  # Faust runs: not waiting for Kafka
    return url


def page_with(url: str, line: str, timeout_s: float = 10.0) -> str:
    """The worker's /metrics page once it shows ``line`` (a counter that moves with the worker's checkpoints)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        if line in text.splitlines():
            return text
        assert time.monotonic() < deadline, f"{line!r} not on the page: " + " ".join(
            x for x in text.splitlines() if x.startswith(line.split("{")[0]))
        time.sleep(0.2)


async def produce(s: Settings, messages: list[tuple[str, bytes]]) -> None:
    p = AIOKafkaProducer(bootstrap_servers=s.bootstrap_servers)
    await p.start()
    try:
        for key, value in messages:
            await p.send_and_wait(s.topic("node-metrics"), value, key=key.encode())
    finally:
        await p.stop()


async def consume_until(s: Settings, topic: str, done: Any, timeout_s: float = 25.0) -> list[dict[str, Any]]:
    """Values of ``topic`` from the start until ``done(values)`` is true."""
    c = AIOKafkaConsumer(s.topic(topic), bootstrap_servers=s.bootstrap_servers, auto_offset_reset="earliest")
    await c.start()
    seen: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + timeout_s
        while not done(seen):
            assert time.monotonic() < deadline, f"{topic}: condition not met; got {seen[-5:]}"
            batch = await c.getmany(timeout_ms=500)
            seen.extend(orjson.loads(m.value) for msgs in batch.values() for m in msgs)
        return seen
    finally:
        await c.stop()


def snapshot(node: str, ts: float, metrics: dict[str, float], node_class: str = "gpu") -> tuple[str, bytes]:
    gpu = "Tesla M40" if node_class == "gpu" else None
    return node, orjson.dumps({"node": node, "ts": ts, "node_class": node_class, "gpu_model": gpu, "metrics": metrics})


def latest(values: list[dict[str, Any]], node: str) -> dict[str, Any] | None:
    mine = [v for v in values if v["node"] == node]
    return mine[-1] if mine else None


def series(node: str, n: int, t0: float) -> tuple[list[tuple[str, bytes]], dict[str, np.ndarray]]:
    rng = np.random.default_rng(len(node))
    util, pcie = rng.uniform(0, 1, n).round(5), rng.uniform(1e9, 2e9, n).round(0)  # utilisation: a fraction
    msgs = [snapshot(node, t0 + i * 0.5, {"nvidia_smi_utilization_gpu": float(u), "pcie_rx_bytes": float(p)})
            for i, (u, p) in enumerate(zip(util, pcie))]
    return msgs, {"nvidia_smi_utilization_gpu": util, "pcie_rx_bytes": pcie}


def check_features(value: dict[str, Any], raw: dict[str, np.ndarray]) -> None:
    f = value["features"]
    for metric, xs in raw.items():
        assert f[f"{metric}__mean"] == pytest.approx(xs.mean(), rel=1e-9)
        assert f[f"{metric}__std"] == pytest.approx(xs.std(), rel=1e-6)
        assert f[f"{metric}__min"] == xs.min() and f[f"{metric}__max"] == xs.max()
        assert f[f"{metric}__last"] == xs[-1]


def test_features_and_dead_letters(kafka_settings: Settings, tmp_path: Path) -> None:
    s = kafka_settings
    t0 = time.time() - 10
    a_msgs, a_raw = series("gpu-a", 12, t0)
    b_msgs, b_raw = series("cpu-b", 7, t0)
    bad = [
        ("gpu-a", b"\x00\xffnot json"),
        ("gpu-a", orjson.dumps({"node": "gpu-a", "ts": "yesterday", "node_class": "gpu", "metrics": {}})),
        ("gpu-a", orjson.dumps({"node": "gpu-a", "ts": t0, "node_class": "gpu"})),
        ("gpu-a", b'{"node":"gpu-a","ts":1,"node_class":"gpu","metrics":{"cpu_iowait":NaN}}'),
        ("gpu-a", orjson.dumps({"node": "gpu-a", "ts": t0, "node_class": "gpu", "metrics": {"cpu_iowait": 1e300}})),
    ]
    good_after = snapshot("cpu-c", t0, {"cpu_iowait": 0.25}, "cpu")
    with ProcessGroup(tmp_path) as group:
        url = start_worker(group, s)
        asyncio.run(produce(s, a_msgs + b_msgs + bad + [good_after]))

        want = (("gpu-a", 12), ("cpu-b", 7), ("cpu-c", 1))
        features = asyncio.run(consume_until(s, "node-features", lambda v: all(
            (x := latest(v, n)) is not None and x["count"] == c for n, c in want)))
        a, b = latest(features, "gpu-a"), latest(features, "cpu-b")
        assert a is not None and b is not None
        check_features(a, a_raw)
        check_features(b, b_raw)
        assert a["node_class"] == "gpu" and a["gpu_model"] == "Tesla M40" and a["window_s"] == s.feature_window_s
        assert latest(features, "cpu-c")["features"]["cpu_iowait__mean"] == 0.25  # type: ignore[index]

        dead = asyncio.run(consume_until(s, "dead-letters", lambda v: len(v) >= 5))
        assert [d["reason"] for d in dead] == ["invalid_json", "schema", "schema", "invalid_json", "schema"]
        assert {d["topic"] for d in dead} == {s.topic("node-metrics")} and all(d["key"] == "gpu-a" for d in dead)
        assert "1000000000000000" in dead[4]["error"]

        # counted once the checkpoint holding them is stored
        text = page_with(url, 'rtt_worker_messages_in_total{topic="node-metrics"} 25.0')
        assert 'rtt_worker_dead_letters_total{reason="invalid_json",topic="node-metrics"} 2.0' in text
        assert "rtt_worker_processing_seconds_bucket" in text
        # everything read: the intake's lag is zero on every node-metrics partition it reported
        lags = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("rtt_worker_intake_lag_messages{") and 'topic="node-metrics"' in line]
        assert lags and all(lag == 0 for lag in lags)


def test_restart_reads_state_back(kafka_settings: Settings, tmp_path: Path) -> None:
    s = kafka_settings
    t0 = time.time() - 10
    msgs, raw = series("gpu-r", 9, t0)
    with ProcessGroup(tmp_path) as group:
        start_worker(group, s, "first")
        asyncio.run(produce(s, msgs[:8]))
        asyncio.run(consume_until(s, "node-features", lambda v: any(x["count"] == 8 for x in v)))
        group.stop()  # SIGTERM: a clean stop commits offsets and flushes the changelog

        url = start_worker(group, s, "second")
        asyncio.run(produce(s, msgs[8:]))
        features = asyncio.run(consume_until(s, "node-features", lambda v: any(x["count"] == 9 for x in v)))
        check_features([x for x in features if x["count"] == 9][-1], raw)
        # the window of 9 came from the changelog and the committed position: the second worker read one message
        page_with(url, 'rtt_worker_messages_in_total{topic="node-metrics"} 1.0')
