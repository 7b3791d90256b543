"""The worker's port, while it waits for its broker at start (:func:`app.health.answer_while_waiting`), answers the
paths its web server serves once it runs (``/metrics``, ``/readyz``, Faust's index ``/``) and 404 for any other, as
that server does. Before, every path was 200: a liveness probe on a path the worker does not serve (``/healthz``, the
trainer's and bridge's) passed through the wait and failed, restarting the pod, once Faust's server took the port."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

from app.health import answer_while_waiting
from app.kafka.embedded import free_port
from app.listen import hold_listen


def get(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_path_the_worker_does_not_serve_is_404_while_it_waits_too() -> None:
    port = free_port()
    held = hold_listen("127.0.0.1", port, "RTT_METRICS_PORT")
    assert held is not None

    async def scenario() -> dict[str, int]:
        async with answer_while_waiting(held, lambda: "kafka: cannot reach Kafka at 127.0.0.1:9"):
            return {path: await asyncio.to_thread(get, port, path)
                    for path in ("/metrics", "/metrics?x=1", "/readyz", "/", "/healthz", "/livez", "/nope")}

    try:
        seen = asyncio.run(scenario())
    finally:
        held.close()
    assert seen == {"/metrics": 200, "/metrics?x=1": 200, "/readyz": 503, "/": 200, "/healthz": 404, "/livez": 404,
                    "/nope": 404}
