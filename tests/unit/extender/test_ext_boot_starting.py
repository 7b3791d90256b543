"""While ``rttsched extender`` is still starting (the service imported and built in a thread), every route the
full server serves gets the starting answer -- ``/explain`` included, which was a 404 "no such path" -- an
unknown path a 404 and a method a path does not take a 405, as the full server answers them.

The start is :func:`app.extender.boot.boot` itself, on a bound socket, held at the import of the service."""

from __future__ import annotations

import asyncio
import importlib
import threading
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

import app.extender.boot as boot_mod
from app.cli.main import main
from app.config import Settings
from app.extender.boot import STARTING, boot, starting_handler
from app.extender.http import Request
from app.extender.options import ExtenderOptions
from app.extender.server import ExtenderServer
from app.extender.service import ExtenderService
from app.kafka.embedded import free_port
from app.listen import listen_on

ARGS = orjson.dumps({"Pod": {"metadata": {"name": "p", "labels": {"rttsched.io/app": "gCTF"}}},
                     "NodeNames": ["gpu-1", "cpu-1"]})


def _settings(tmp_path: Path) -> Settings:
    return Settings.from_env({"RTT_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}", "REDIS_URL": "",
                              "RTT_MODELS_DIR": str(tmp_path / "models")})


def _full_routes(tmp_path: Path) -> dict[str, list[str]]:
    """path -> methods of the full server, from the server itself."""
    server = ExtenderServer(ExtenderService(_settings(tmp_path), publish=False, kafka=False, redis=False))
    return server._methods


class Starting:
    """``boot`` serving a socket while the import of the service waits for :meth:`release`."""

    def __init__(self) -> None:
        self.importing = threading.Event()
        self._go = threading.Event()

    def import_module(self, name: str) -> types.ModuleType:
        self.importing.set()
        assert self._go.wait(30), "the start was never released"
        return importlib.import_module(name)

    def release(self) -> None:
        self._go.set()


@pytest.fixture
async def starting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Starting, str]]:
    hold = Starting()
    monkeypatch.setattr(boot_mod, "importlib", hold)
    settings = _settings(tmp_path)
    options = ExtenderOptions.from_settings(settings)
    sock = listen_on("127.0.0.1", 0)
    stop = asyncio.Event()
    task = asyncio.ensure_future(boot(settings, options, sock, publish=False, redis=False, announce=lambda _: None,
                                      stop=stop, tune_gc=False))
    try:
        assert await asyncio.to_thread(hold.importing.wait, 10), "boot never began importing the service"
        yield hold, f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        hold.release()
        stop.set()
        await asyncio.wait_for(task, 30)
        sock.close()


async def _ask(session: aiohttp.ClientSession, method: str, path: str) -> tuple[int, Any, str]:
    """Status, the error named in the JSON body (the body itself when it names none) and the Allow header."""
    async with session.request(method, path, data=ARGS if method == "POST" else None) as resp:
        body = await resp.json(content_type=None)
        error = body.get("Error") if isinstance(body, dict) and body.get("Error") else body
        return resp.status, error, resp.headers.get("Allow", "")


def test_the_starting_routes_are_the_full_servers(tmp_path):
    assert {path: list(methods) for path, methods in boot_mod.ROUTES.items()} == _full_routes(tmp_path)


async def test_every_route_gets_the_starting_answer_while_starting(starting, tmp_path):
    hold, url = starting
    async with aiohttp.ClientSession(base_url=url, timeout=aiohttp.ClientTimeout(total=5)) as session:
        for path, methods in _full_routes(tmp_path).items():
            for method in methods:
                status, error, _ = await _ask(session, method, path)
                assert status != 404, (method, path, error)
                if path in ("/filter", "/prioritize", "/healthz"):
                    assert status == 200, (method, path, error)
                else:  # nothing to answer from yet: as /readyz says, starting
                    assert (status, error) == (503, STARTING), (method, path, error)
        assert (await _ask(session, "POST", "/explain"))[:2] == (503, STARTING)
        assert (await _ask(session, "GET", "/nowhere"))[:2] == (404, "no such path: /nowhere")
        assert await _ask(session, "GET", "/explain") == (405, "method GET not allowed on /explain", "POST")

        hold.release()  # the full server takes over: /explain is its own now, and the 405 the same

        async def explained() -> int:
            while True:
                status = (await _ask(session, "POST", "/explain"))[0]
                if status != 503:
                    return status
                await asyncio.sleep(0.05)

        assert await asyncio.wait_for(explained(), 20) == 200
        assert await _ask(session, "GET", "/explain") == (405, "method GET not allowed on /explain", "POST")
        assert (await _ask(session, "GET", "/nowhere"))[:2] == (404, "no such path: /nowhere")


async def test_rttsched_explain_says_the_extender_is_starting(starting, capsys):
    _, url = starting
    code = await asyncio.to_thread(main, ["explain", "--url", url, "--app", "gCTF", "--nodes", "gpu-1",
                                          "--timeout", "5"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.endswith(f"the extender at {url} answered 503: {STARTING}"), err


@pytest.mark.parametrize(("method", "path", "status"), [
    ("POST", "/explain", 503), ("GET", "/metrics", 503), ("GET", "/openapi.json", 503), ("GET", "/readyz", 503),
    ("GET", "/healthz", 200), ("POST", "/filter", 200), ("POST", "/prioritize", 200),
    ("GET", "/filter", 405), ("POST", "/metrics", 405), ("GET", "/nowhere", 404), ("POST", "/", 404),
])
def test_starting_handler(method, path, status):
    response = starting_handler(Request(method, path, {}, ARGS))
    assert response.status == status
    assert orjson.loads(response.body)
