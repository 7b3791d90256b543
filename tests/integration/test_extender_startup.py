"""``rttsched extender`` as an operator starts it: before Kafka exists, then a broker, then topics.

The extender runs as a child process. With no broker at all it serves (neutral answers, ``/readyz`` 503
with the reason; how soon after its start: ``bench/bench_extender.py``); a broker started afterwards
without the topics is reported every second and never gets topics created by the extender; once the topics
and the view exist the extender becomes ready unaided. The same process then cuts off a slow-header client
and keeps ``/metrics`` bounded after pods of 10,000 distinct apps.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiokafka import AIOKafkaProducer

from app.config import Settings
from app.contracts.codec import encode
from app.kafka.admin import ensure_topics
from app.kafka.embedded import EmbeddedBroker, free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
POD = orjson.loads((ROOT / "tests" / "fixtures" / "kube" / "pod_gctf.json").read_bytes())
NAMES = ["gpu-fast", "gpu-slow"]


class Extender:
    """The child process, its log, and a base URL."""

    def __init__(self, kafka_port: int, prefix: str, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "extender.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "RTT_KAFKA_BOOTSTRAP": f"127.0.0.1:{kafka_port}",
               "RTT_TOPIC_PREFIX": prefix, "REDIS_URL": "", "RTT_MODELS_DIR": str(tmp / "models"),
               "RTT_EXTENDER_REPORT_S": "1", "RTT_EXTENDER_HEADER_TIMEOUT_S": "1",
               "RTT_EXTENDER_REBUILD_INTERVAL_S": "0.05"}
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "app.cli.main", "extender", "--host", "127.0.0.1", "--port", str(self.port),
                 "--no-redis"], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def no_broker(tmp_path: Path) -> Iterator[tuple[Extender, int, str]]:
    kafka_port, prefix = free_port(), f"t{uuid.uuid4().hex[:10]}-"
    ext = Extender(kafka_port, prefix, tmp_path)
    try:
        yield ext, kafka_port, prefix
    finally:
        ext.stop()


def args(names: list[str], app: str = "gCTF") -> bytes:
    pod = {**POD, "metadata": {**POD["metadata"], "labels": {"rttsched.io/app": app}}}
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})


async def readyz(session: aiohttp.ClientSession) -> tuple[int, dict[str, Any]]:
    async with session.get("/readyz") as resp:
        return resp.status, await resp.json(content_type=None)


async def until(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what} not within {timeout_s} s"
        await asyncio.sleep(0.1)


async def publish_view(settings: Settings) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    await producer.start()
    try:
        now = time.time()
        for node, rtt in (("gpu-fast", 100.0), ("gpu-slow", 400.0)):
            for topic, value in (
                ("node-features", {"node": node, "ts": now, "node_class": "gpu", "gpu_model": "Tesla M40",
                                   "window_s": 30.0, "count": 30, "features": {"load__mean": 0.5}}),
                ("node-weights", {"node": node, "ts": now, "weight": 1.0, "predicted_rtt_ms": {"gCTF": rtt},
                                  "stale": False})):
                await producer.send_and_wait(settings.topic(topic), encode(topic, value), key=node.encode())
    finally:
        await producer.stop()


async def test_serves_at_once_without_kafka_and_becomes_ready_when_it_arrives(
        no_broker: tuple[Extender, int, str]) -> None:
    ext, kafka_port, prefix = no_broker
    async with aiohttp.ClientSession(base_url=ext.url, timeout=aiohttp.ClientTimeout(total=5)) as session:
        async def healthy() -> bool:
            try:
                async with session.get("/healthz") as resp:
                    return resp.status == 200
            except aiohttp.ClientConnectionError:
                return False

        # no broker exists yet: answering at all is serving without Kafka (how soon after the start:
        # bench/bench_extender.py, its start-up table)
        await until(healthy, 30, "/healthz")
        assert ext.text().startswith(f"rttsched extender: listening on http://127.0.0.1:{ext.port}")
        async with session.post("/prioritize", data=args(NAMES)) as resp:
            assert resp.status == 200 and await resp.json() == [{"Host": n, "Score": 5} for n in NAMES]
        async def broker_missing() -> bool:  # "starting" first, then the feed's reason
            status, body = await readyz(session)
            assert status == 503 and body["ready"] is False
            return "not usable" in body["Error"]

        await until(broker_missing, 10, "the missing broker reported in /readyz")

        broker = EmbeddedBroker(port=kafka_port)
        await asyncio.to_thread(broker.start)
        try:
            async def waiting_for_topics() -> bool:
                return "waiting for topics" in (await readyz(session))[1].get("Error", "")

            await until(waiting_for_topics, 30, "the missing topics reported in /readyz")
            await asyncio.sleep(2.5)
            assert ext.text().count("waiting for topics") >= 2  # reported again while they are missing
            settings = Settings.from_env({}, kafka_bootstrap=f"127.0.0.1:{kafka_port}", topic_prefix=prefix)
            await ensure_topics(settings)  # the extender never created them: creating finds none there
            await publish_view(settings)

            async def ready() -> bool:
                return (await readyz(session))[0] == 200

            await until(ready, 30, "ready after the broker, topics and view arrived")
            async with session.post("/prioritize", data=args(NAMES)) as resp:
                assert await resp.json() == [{"Host": "gpu-fast", "Score": 10}, {"Host": "gpu-slow", "Score": 2}]

            await slow_header_client_is_cut_off(ext.port)
            await metric_labels_stay_bounded(session)

            await asyncio.to_thread(broker.stop)  # the broker goes away while the extender serves its view

            async def kafka_degraded() -> bool:
                status, body = await readyz(session)
                assert status == 200  # still serving the view it has
                return "not answering" in body["degraded"].get("kafka", "") or "not usable" in body[
                    "degraded"].get("kafka", "")

            await until(kafka_degraded, 30, "the lost broker named in /readyz")
            async with session.get("/metrics") as resp:
                assert 'rtt_extender_degraded{reason="kafka"} 1.0' in await resp.text()
            broker = EmbeddedBroker(port=kafka_port)
            await asyncio.to_thread(broker.start)

            async def kafka_back() -> bool:
                return "kafka" not in (await readyz(session))[1]["degraded"]

            await until(kafka_back, 30, "the broker's return clearing the reason")
        finally:
            await asyncio.to_thread(broker.stop)
    assert "Traceback" not in ext.text()


async def slow_header_client_is_cut_off(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = time.monotonic()
    answer = asyncio.ensure_future(reader.read())
    header = b"POST /filter HTTP/1.1\r\nHost: x\r\n"  # never a whole header block: no empty line
    sent = 0
    for byte in header:  # one byte every 0.3 s (the timeout, RTT_EXTENDER_HEADER_TIMEOUT_S, is 1 s)
        if answer.done():
            break
        writer.write(bytes([byte]))
        sent += 1
        await asyncio.sleep(0.3)
    data = await asyncio.wait_for(answer, 10)
    writer.close()
    assert data.startswith(b"HTTP/1.1 408") and b"request header not received within 1 s" in data, data
    assert sent < len(header), "answered only once the client had sent everything"  # cut off while sending
    assert time.monotonic() - t0 < 10 * 1.0  # a hang, not a speed: 10 x the timeout


async def metric_labels_stay_bounded(session: aiohttp.ClientSession) -> None:
    async def series() -> list[str]:
        async with session.get("/metrics") as resp:
            return [ln for ln in (await resp.text()).splitlines() if ln and not ln.startswith("#")]

    await series()  # the /metrics verb's own series exist from here on
    before = await series()
    apps = iter(range(10_000))

    async def worker() -> None:
        for i in apps:
            async with session.post("/prioritize", data=args(NAMES, app=f"app-{i}")) as resp:
                assert resp.status == 200
                await resp.read()

    await asyncio.gather(*(worker() for _ in range(8)))
    after = await series()
    # gCTF was scored once before; no policy names it and no model exists, so it is "other" as well
    assert 'rtt_extender_scored_pods_total{app="other"} 10001.0' in after
    assert len(after) <= len(before) + 2, f"{len(before)} series before, {len(after)} after 10,000 apps"
