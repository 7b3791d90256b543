"""``rttsched bridge`` as Kubernetes and docker stop it: SIGTERM while a scrape is under way, against the real
embedded broker and a local HTTP server serving node_exporter captures.

The scrape the signal comes in finishes and is published with the ones before it; the bridge says so in one line and
exits 0, its /healthz (the compose healthcheck's command, run as compose runs it) answering until then. Ctrl-C stays
an interruption (130).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from aiokafka import AIOKafkaConsumer
from child_processes import lines_until

from app.config import Settings
from app.contracts import decode
from app.kafka.embedded import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CAPTURES = [REPO / "tests" / "fixtures" / "exporters" / f"node_exporter-1.5.0.scrape-{x}.prom" for x in "ab"]
STALL_S = 1.0  # the scrape the signal comes in: the exporter answers this late (the scrape timeout is 2 s)
NODE = "worker-7"


class _Exporter(http.server.BaseHTTPRequestHandler):
    pages = [p.read_bytes() for p in CAPTURES]
    stall_at = 3  # the request that stalls
    hits = 0
    stalling = threading.Event()

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        cls = type(self)
        cls.hits += 1
        if cls.hits == cls.stall_at:
            cls.stalling.set()
            time.sleep(STALL_S)
        body = cls.pages[min(cls.hits, len(cls.pages)) - 1]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        return None


@contextlib.contextmanager
def exporter() -> Iterator[tuple[str, type[_Exporter]]]:
    handler = type("Exporter", (_Exporter,), {"hits": 0, "stalling": threading.Event()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics", handler
    finally:
        server.shutdown()
        server.server_close()


def start_bridge(s: Settings, url: str, port: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update({"RTT_KAFKA_BOOTSTRAP": s.bootstrap_servers, "RTT_TOPIC_PREFIX": s.topic_prefix,
                "RTT_METRICS_PORT": str(port), "RTT_METRICS_HOST": "127.0.0.1", "RTT_SCRAPE_INTERVAL_S": "0.5"})
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", "bridge", "--target", f"node={NODE},url={url}"],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    said = lines_until(proc.stdout, lambda line: not line or line.startswith("bridge: "), 30)
    assert said and said[-1].startswith("bridge: 1 node(s)"), "".join(said)
    return proc


@contextlib.contextmanager
def bridge(s: Settings, url: str, port: int) -> Iterator[subprocess.Popen[str]]:
    """:func:`start_bridge`, killed at the end if it still runs."""
    proc = start_bridge(s, url, port)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def compose_healthcheck(service: str) -> list[str]:
    """The service's healthcheck command in docker-compose.yml, with this interpreter for ``python3``."""
    test = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"][service]["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1] == "python3", test
    return [sys.executable, *test[2:]]


async def node_metrics(s: Settings, n: int, timeout_s: float = 15.0) -> list[dict[str, object]]:
    """The node-metrics messages on the topic: ``n`` once they are there, and any more that come within 1 s."""
    c = AIOKafkaConsumer(s.topic("node-metrics"), bootstrap_servers=s.bootstrap_servers,
                         auto_offset_reset="earliest", enable_auto_commit=False)
    await c.start()
    out = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(out) < n and time.monotonic() < deadline:
            batch = await c.getmany(timeout_ms=300)
            out += [m for msgs in batch.values() for m in msgs]
        batch = await c.getmany(timeout_ms=1000)
        out += [m for msgs in batch.values() for m in msgs]
    finally:
        await c.stop()
    assert all(m.key == NODE.encode() for m in out)
    return [decode("node-metrics", m.value, strict=True) for m in sorted(out, key=lambda m: m.offset)]


def test_sigterm_during_a_scrape_finishes_it_publishes_it_and_exits_0(kafka_settings: Settings) -> None:
    port = free_port()
    with exporter() as (url, served):
        with bridge(kafka_settings, url, port) as proc:
            check = subprocess.run(compose_healthcheck("bridge"), env={**os.environ, "RTT_METRICS_PORT": str(port)},
                                   capture_output=True, text=True, timeout=10, check=False)
            assert check.returncode == 0, check.stderr
            assert served.stalling.wait(20), "the third scrape never came"
            proc.send_signal(signal.SIGTERM)  # while that scrape waits for the exporter
            out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{err}"
    stop_lines = [line for line in out.splitlines() if line.startswith("bridge: stopped")]
    assert stop_lines == ["bridge: stopped (SIGTERM), 3 rounds, 3 messages, 0 failed scrapes, "
                          "0 rounds not taken by Kafka"], out
    assert "Traceback" not in out + err and "interrupted" not in err
    assert served.hits == 3  # no round started after the signal
    messages = asyncio.run(node_metrics(kafka_settings, 3))
    assert len(messages) == 3  # the scrape under way at the signal included
    assert [m["node"] for m in messages] == [NODE] * 3 and all(m["metrics"] for m in messages)
    assert messages[0]["ts"] < messages[1]["ts"] < messages[2]["ts"]


def test_sigterm_sent_again_and_again_while_it_stops_still_ends_it_cleanly(kafka_settings: Settings) -> None:
    """A supervisor that asks again (SIGTERM every 20 ms until the process is gone): the stop is not cut short
    once the first signal's handling is done and the bridge winds down. Before, a second SIGTERM 50 ms after the
    first killed it (143) after its stop line."""
    with exporter() as (url, _):
        with bridge(kafka_settings, url, free_port()) as proc:
            deadline = time.monotonic() + 15
            while proc.poll() is None and time.monotonic() < deadline:
                proc.send_signal(signal.SIGTERM)
                time.sleep(0.02)
            out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{err}"
    assert any(line.startswith("bridge: stopped (SIGTERM)") for line in out.splitlines()), out
    assert "Traceback" not in out + err


def test_sigint_is_still_an_interruption(kafka_settings: Settings) -> None:
    with exporter() as (url, _):
        with bridge(kafka_settings, url, free_port()) as proc:
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=15)
    assert proc.returncode == 130 and "rttsched bridge: interrupted" in err, f"{out}\n{err}"
    assert "Traceback" not in out + err
