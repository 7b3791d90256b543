"""The worker's web server serves /metrics and /readyz on the socket bound at start; nothing can take its port."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from pathlib import Path

import pytest

from app.config import Settings
from app.errors import ConfigError
from app.listen import hold_listen
from app.streams.app import create_app
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
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read()

    async def run() -> None:
        await app.web.start_server()
        try:
            status, body = await asyncio.to_thread(get, "/metrics")
            assert status == 200 and b"# TYPE" in body
            status, _ = await asyncio.to_thread(get, "/readyz")
            assert status in (200, 503)
        finally:
            await app.web.stop_server()

    asyncio.run(run())
    assert held.fileno() == -1  # closed with the server: the port is free again
    hold_listen("127.0.0.1", port, "RTT_METRICS_PORT").close()  # type: ignore[union-attr]


def test_port_zero_holds_nothing() -> None:
    assert hold_listen("127.0.0.1", 0, "RTT_METRICS_PORT") is None
