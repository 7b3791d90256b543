"""Health while a service waits for its broker at start: the trainer's and bridge's ``/readyz`` is 503 naming
``kafka`` while ``/healthz`` stays 200 (liveness); the worker, whose web server runs only once Faust starts, answers
probes on its held port meanwhile (:func:`app.health.answer_while_waiting`) and hands the port on still listening.
Before, the trainer served nothing until the broker answered, the bridge's ``/healthz`` went 503 after 30 s of the
check (its heartbeat did not beat), and the worker's port took connections that nothing answered: a liveness
probe restarted them all."""

from __future__ import annotations

import asyncio
import socket

from child_processes import http_get
from prometheus_client import CollectorRegistry

from app.health import Heartbeat, answer_while_waiting, health_app
from app.listen import hold_listen


def call(app, path: str) -> tuple[str, bytes]:
    got: list[str] = []
    body = b"".join(app({"PATH_INFO": path, "REQUEST_METHOD": "GET"}, lambda status, headers: got.append(status)))
    return got[0], body


def test_readyz_names_what_the_process_waits_for_while_healthz_stays_ok():
    heartbeat = Heartbeat()
    app = health_app(CollectorRegistry(), heartbeat)
    heartbeat.waiting = "kafka: cannot reach Kafka at 127.0.0.1:9 (RTT_KAFKA_BOOTSTRAP): refused"
    assert call(app, "/readyz") == ("503 Service Unavailable",
                                    b"not ready: kafka: cannot reach Kafka at 127.0.0.1:9 (RTT_KAFKA_BOOTSTRAP): "
                                    b"refused\n")
    assert call(app, "/healthz") == ("200 OK", b"ok\n")
    heartbeat.waiting = None
    assert call(app, "/readyz") == ("200 OK", b"ok\n")


def test_readyz_fails_with_a_stuck_event_loop_too():
    clock = iter([0.0, 100.0, 100.0]).__next__
    app = health_app(CollectorRegistry(), Heartbeat(stale_after_s=30.0, clock=clock))
    status, body = call(app, "/readyz")
    assert status == "503 Service Unavailable" and body.startswith(b"event loop silent"), body


def test_the_held_port_answers_probes_while_waiting_and_stays_listening_after():
    held = hold_listen("127.0.0.1", 0, "RTT_METRICS_PORT")
    assert held is None  # port 0: nothing held, nothing served
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    held = hold_listen("127.0.0.1", port, "RTT_METRICS_PORT")
    assert held is not None
    reason: list[str | None] = ["kafka: no topic node-metrics on 127.0.0.1:9"]

    async def scenario() -> list[tuple[int, bytes]]:
        async with answer_while_waiting(held, lambda: reason[0]):
            seen = [await asyncio.to_thread(http_get, port, path) for path in ("/readyz", "/metrics")]
            reason[0] = None
            seen.append(await asyncio.to_thread(http_get, port, "/readyz"))
        return seen

    try:
        seen = asyncio.run(scenario())
        assert seen == [(503, b"not ready: kafka: no topic node-metrics on 127.0.0.1:9\n"), (200, b""),
                        (200, b"ok\n")]
        # the held socket is still bound and listening for the server that follows: a connection is queued on it
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            held.settimeout(5)
            conn, _ = held.accept()
            conn.close()
    finally:
        held.close()


def test_nothing_is_served_without_a_port():
    async def scenario() -> None:
        async with answer_while_waiting(None, lambda: "kafka"):
            pass

    asyncio.run(scenario())
