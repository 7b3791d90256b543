"""``rtt_kafka_start_waiting``: 1 while a worker, trainer or bridge waits at start for its broker and topics, 0
once they answered, in the process's registry -- which the worker's port serves while it waits, as the real
exposition (the series Faust's page serves after), not an empty page. Before, a waiting service answered its
``/metrics`` (``up`` 1) with nothing that said it waited: a wrong RTT_TOPIC_PREFIX waited for ever, unalerted."""

from __future__ import annotations

import asyncio
import socket
import urllib.request

from prometheus_client import CollectorRegistry

from app.config import Settings
from app.health import answer_while_waiting
from app.kafka.admin import TopicError, start_waiting_gauge, wait_reachable

NAME = "rtt_kafka_start_waiting"


def test_the_gauge_is_1_while_the_tries_fail_and_0_once_one_passes():
    registry = CollectorRegistry()
    seen: list[float | None] = []
    tries = iter([TopicError("no topic rtt-node-metrics: create them with rttsched topics create")] * 3 + [None])

    async def check(settings, topics) -> None:
        seen.append(registry.get_sample_value(NAME))
        failure = next(tries)
        if failure is not None:
            raise failure

    async def no_sleep(_s: float) -> None:
        return None

    asyncio.run(wait_reachable(Settings(), ("node-metrics",), service="worker", check=check, sleep=no_sleep,
                               registry=registry))
    assert seen == [1.0, 1.0, 1.0, 1.0]
    assert registry.get_sample_value(NAME) == 0.0


def test_one_gauge_per_registry_made_at_0():
    registry = CollectorRegistry()
    assert start_waiting_gauge(registry) is start_waiting_gauge(registry)
    assert registry.get_sample_value(NAME) == 0.0


def test_the_worker_s_port_serves_the_registry_s_exposition_while_it_waits():
    registry = CollectorRegistry()
    start_waiting_gauge(registry).set(1)
    held = socket.create_server(("127.0.0.1", 0))
    port = held.getsockname()[1]

    async def main() -> tuple[int, str, str]:
        async with answer_while_waiting(held, lambda: "kafka: not asked yet", registry):
            def get() -> tuple[int, str, str]:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    return r.status, r.headers["Content-Type"], r.read().decode()
            return await asyncio.to_thread(get)

    try:
        status, kind, body = asyncio.run(main())
    finally:
        held.close()
    assert status == 200 and kind.startswith("text/plain"), kind
    assert f"# TYPE {NAME} gauge" in body and f"\n{NAME} 1.0\n" in body, body
