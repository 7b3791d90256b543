"""The worker's web server serves /metrics and /readyz on the socket bound at start; nothing can take its port.

/readyz answers 503 until the app's consumer has started (the boot step after it reached), then the worker's status."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from app.config import Settings
from app.errors import ConfigError
from app.listen import hold_listen
from app.streams.app import create_app, start_steps
from app.streams.options import WorkerOptions
from app.streams.web import HeldSocketWeb


def test_the_web_server_serves_on_the_held_socket_and_the_port_stays_taken(tmp_path: Path) -> None:
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    held = hold_listen("127.0.0.1", port, "RTT_METRICS_PORT")
    assert held is not None
    with pytest.raises(ConfigError, match=f"RTT_METRICS_PORT: cannot listen on 127.0.0.1:{port}"):
        hold_listen("127.0.0.1", port, "RTT_METRICS_PORT")  # held: a second process is refused
    settings = Settings.from_env({"RTT_METRICS_PORT": str(port)})
    app = create_app(settings, id="held-web", options=WorkerOptions.from_settings(settings, datadir=str(tmp_path)),
                     web_socket=held)
    assert isinstance(app.web, HeldSocketWeb)

    def get(path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    async def run() -> None:
        await app.web.start_server()
        try:
            status, body = await asyncio.to_thread(get, "/metrics")
            assert status == 200 and b"# TYPE" in body
            # the consumer not started yet (Faust starts it after the web server): not ready, then ready once it has
            assert await asyncio.to_thread(get, "/readyz") == (503, b"not ready: kafka: its consumer starting\n")
            await start_steps(app).after_consumer.on_start()
            assert await asyncio.to_thread(get, "/readyz") == (200, b'{"ready":true,"degraded":{}}')
        finally:
            await app.web.stop_server()

    asyncio.run(run())
    assert held.fileno() == -1  # closed with the server: the port is free again
    hold_listen("127.0.0.1", port, "RTT_METRICS_PORT").close()  # type: ignore[union-attr]


def test_port_zero_holds_nothing() -> None:
    assert hold_listen("127.0.0.1", 0, "RTT_METRICS_PORT") is None
