"""/healthz beside /metrics for the processes that serve them from a thread: it fails while the event loop is
stuck, which /metrics (answered by that thread whatever the loop does) never showed."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from app.errors import ConfigError
from app.health import Heartbeat, beating, serve_metrics_and_health
from app.kafka.embedded import free_port


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Counter("rtt_test_things", "things", registry=reg).inc(3)
    return reg


def test_healthz_follows_the_heartbeat_and_metrics_are_served_as_before() -> None:
    now = [100.0]
    heartbeat = Heartbeat(stale_after_s=30.0, clock=lambda: now[0])
    port = free_port()
    server = serve_metrics_and_health(port, "127.0.0.1", registry(), heartbeat)
    try:
        assert get(port, "/healthz") == (200, "ok\n")
        now[0] += 45.0
        assert get(port, "/healthz") == (503, "event loop silent for 45 s\n")
        heartbeat.beat()
        assert get(port, "/healthz")[0] == 200
        for path in ("/metrics", "/"):
            status, body = get(port, path)
            assert status == 200 and "rtt_test_things_total 3.0" in body
    finally:
        server.shutdown()
        server.server_close()


def test_a_stuck_event_loop_fails_healthz_while_metrics_still_answer() -> None:
    heartbeat = Heartbeat(stale_after_s=1.5)
    port = free_port()
    server = serve_metrics_and_health(port, "127.0.0.1", registry(), heartbeat)
    seen: dict[str, tuple[int, str]] = {}
    blocking, probed = threading.Event(), threading.Event()

    async def work() -> None:
        seen["beating"] = await asyncio.to_thread(get, port, "/healthz")
        blocking.set()
        probed.wait(30)  # a call that blocks the loop: no beat until it returns
        await asyncio.sleep(1.2)
        seen["again"] = await asyncio.to_thread(get, port, "/healthz")

    def probe_while_stuck() -> None:
        blocking.wait(30)
        time.sleep(2.5)
        seen["during"] = get(port, "/healthz")
        seen["metrics during"] = get(port, "/metrics")
        probed.set()

    prober = threading.Thread(target=probe_while_stuck)
    prober.start()
    try:
        asyncio.run(beating(work(), heartbeat))
    finally:
        probed.set()
        prober.join()
        server.shutdown()
        server.server_close()
    assert seen["beating"][0] == 200
    assert seen["during"][0] == 503 and seen["during"][1].startswith("event loop silent for")
    assert seen["metrics during"][0] == 200  # what a probe on /metrics saw
    assert seen["again"][0] == 200


def test_a_taken_port_is_named() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"RTT_METRICS_PORT: cannot listen on 127.0.0.1:{port}"):
            serve_metrics_and_health(port, "127.0.0.1", registry(), Heartbeat())
