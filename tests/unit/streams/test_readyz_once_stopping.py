"""The worker's /readyz answers 503 again once the worker stops (SIGTERM) or crashes, after its consumer had started.

Before, the step after the consumer, once reached, kept /readyz at 200 through the whole stop (tables, agents and
the consumer stopped before the web server) and after a crash until the process ended."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import faust
import pytest

from app.config import Settings
from app.listen import hold_listen
from app.streams.app import create_app, start_steps
from app.streams.options import WorkerOptions


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


async def stop(app: faust.App) -> None:
    await app.stop()


async def crash(app: faust.App) -> None:
    await app.consumer.crash(RuntimeError("the consumer's thread ended"))  # mode marks its app crashed too


@pytest.mark.parametrize("end", [stop, crash], ids=["stopping", "crashed"])
def test_readyz_is_503_once_the_worker_stops_or_crashes(tmp_path: Path,
                                                        end: Callable[[faust.App], Awaitable[None]]) -> None:
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    held = hold_listen("127.0.0.1", port, "RTT_METRICS_PORT")
    settings = Settings.from_env({"RTT_METRICS_PORT": str(port)})
    app = create_app(settings, id="readyz-stop", options=WorkerOptions.from_settings(settings, datadir=str(tmp_path)),
                     web_socket=held)

    async def run() -> None:
        await app.web.start_server()
        try:
            await start_steps(app).after_consumer.on_start()
            assert await asyncio.to_thread(get, port, "/readyz") == (200, b'{"ready":true,"degraded":{}}')
            await end(app)
            assert await asyncio.to_thread(get, port, "/readyz") == (503, b"not ready: the worker is stopping\n")
            assert (await asyncio.to_thread(get, port, "/metrics"))[0] == 200
        finally:
            await app.web.stop_server()

    asyncio.run(run())
