"""A Redis that refuses the password it is given is named by what gives it -- ``RTT_REDIS_PASSWORD_FILE``, set
or not -- where ``rttsched pods --once`` writes its view after the PING (the password rotated in between) and
where ``rttsched publish`` reads the nodes that have metrics, as ``rttsched models`` and the PING name it; not
only ``REDIS_URL``. Against a real redis-server asking for a password (``--requirepass``, or ``CONFIG SET``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import redis
from aiohttp import web
from fault_stack import RedisServer
from redis_servers import PASSWORD, locked, server
from test_redis_password_named import _error, _password_file

from app.cli.main import main

pytestmark = pytest.mark.integration

ROTATED = "r0tated-pw"  # noqa: S105 - what the test server asks for once the password is rotated
PODS = Path(__file__).resolve().parents[1] / "fixtures" / "pods" / "podlist.json"
UNSET = "RTT_REDIS_PASSWORD_FILE is not set and REDIS_URL has no password: this Redis asks for one"
IN_URL = "RTT_REDIS_PASSWORD_FILE is not set: Redis refused the password in REDIS_URL"


# -- rttsched pods --once: the PING passes, the password is rotated before the view is written


class RotatingApi:
    """``GET /api/v1/pods``: one PodList page; answering it first makes the Redis ask for :data:`ROTATED`."""

    def __init__(self, server: RedisServer, password: str) -> None:
        self.server, self.password = server, password
        self.url = ""
        self.rotated = False
        self._runner: web.AppRunner | None = None

    async def start(self) -> RotatingApi:
        app = web.Application()
        app.router.add_get("/api/v1/pods", self._pods)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _pods(self, request: web.Request) -> web.Response:
        admin = redis.Redis(host="127.0.0.1", port=self.server.port, password=self.password or None)
        try:
            await asyncio.to_thread(admin.config_set, "requirepass", ROTATED)
        finally:
            admin.close()
        self.rotated = True
        return web.json_response(json.loads(PODS.read_text()))


__all__ = ["locked", "server"]  # the fixtures, used here


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("RTT_REDIS_PASSWORD_FILE", raising=False)
    monkeypatch.setenv("RTT_KAFKA_BOOTSTRAP", "127.0.0.1:1")  # not reached
    monkeypatch.setenv("RTT_MODELS_DIR", str(tmp_path / "models"))
    return monkeypatch


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[RotatingApi], Awaitable[RotatingApi]]]:
    """Starts an API for the test, stopped at its end."""
    started: list[RotatingApi] = []

    async def start(api: RotatingApi) -> RotatingApi:
        started.append(await api.start())
        return api

    yield start
    for api in started:
        await api.stop()


async def _pods_once(api_url: str) -> int:
    return await asyncio.to_thread(main, ["pods", "--once", "--api-url", api_url])


async def test_pods_once_with_a_password_file_rotated_away_names_the_file(env, locked, serve, tmp_path, capsys):
    path = _password_file(tmp_path, PASSWORD)
    env.setenv("REDIS_URL", locked.url)
    env.setenv("RTT_REDIS_PASSWORD_FILE", path)
    api = await serve(RotatingApi(locked, PASSWORD))
    assert await _pods_once(api.url) == 2
    line = _error(capsys)
    assert api.rotated  # the PING passed: the refusal came with the view's writes
    assert line.startswith(f"rttsched pods: error: RTT_REDIS_PASSWORD_FILE: cannot use Redis at {locked.url}: "), line
    assert line.endswith(f"(RTT_REDIS_PASSWORD_FILE is set ({path}): Redis refused the password in it)"), line
    assert PASSWORD not in line


async def test_pods_once_with_a_url_password_rotated_away_names_both(env, locked, serve, capsys):
    env.setenv("REDIS_URL", locked.url.replace("redis://", f"redis://:{PASSWORD}@"))
    api = await serve(RotatingApi(locked, PASSWORD))
    assert await _pods_once(api.url) == 2
    line = _error(capsys)
    assert api.rotated and line.startswith("rttsched pods: error: RTT_REDIS_PASSWORD_FILE: "), line
    assert line.endswith(f"({IN_URL})") and PASSWORD not in line, line


async def test_pods_once_when_redis_begins_asking_for_a_password_names_the_unset_file(env, server, serve, capsys):
    env.setenv("REDIS_URL", server.url)
    api = await serve(RotatingApi(server, ""))
    assert await _pods_once(api.url) == 2
    line = _error(capsys)
    assert api.rotated and line.startswith("rttsched pods: error: RTT_REDIS_PASSWORD_FILE: "), line
    assert line.endswith(f"({UNSET})"), line


async def test_pods_once_with_redis_gone_after_the_ping_still_names_redis_url(env, server, serve, capsys):
    class Gone(RotatingApi):
        async def _pods(self, request: web.Request) -> web.Response:
            self.server.stop()
            return web.json_response(json.loads(PODS.read_text()))

    env.setenv("REDIS_URL", server.url)
    api = await serve(Gone(server, ""))
    assert await _pods_once(api.url) == 2
    assert _error(capsys).startswith(f"rttsched pods: error: REDIS_URL: cannot use Redis at {server.url}: ")


# -- rttsched publish: the nodes that have metrics, read from Redis before anything is published


def _publish(tmp_path: Path) -> int:
    values = tmp_path / "completions.jsonl"
    values.write_text("{}\n")
    return main(["publish", "task-completions", str(values), "--dry-run"])


@pytest.mark.parametrize("password", [None, "not-the-password"])
def test_publish_names_the_password_file(env, locked, tmp_path, capsys, password):
    env.setenv("REDIS_URL", locked.url)
    path = ""
    if password is not None:
        path = _password_file(tmp_path, password)
        env.setenv("RTT_REDIS_PASSWORD_FILE", path)
    assert _publish(tmp_path) == 2
    line = _error(capsys)
    assert line.startswith("rttsched publish: error: RTT_REDIS_PASSWORD_FILE: cannot read the nodes that have "
                           "metrics: "), line
    said = f"RTT_REDIS_PASSWORD_FILE is set ({path}): Redis refused the password in it" if path else UNSET
    assert line.endswith(f"({said})") and "not-the-password" not in line, line


def test_publish_with_a_wrong_password_in_the_url_names_both(env, locked, tmp_path, capsys):
    env.setenv("REDIS_URL", locked.url.replace("redis://", "redis://:not-the-password@"))
    assert _publish(tmp_path) == 2
    line = _error(capsys)
    assert line.startswith("rttsched publish: error: RTT_REDIS_PASSWORD_FILE: "), line
    assert line.endswith(f"({IN_URL})") and "not-the-password" not in line, line


def test_publish_with_redis_away_still_names_redis_url(env, locked, tmp_path, capsys):
    env.setenv("REDIS_URL", locked.url)
    locked.stop()
    assert _publish(tmp_path) == 2
    assert _error(capsys).startswith("rttsched publish: error: REDIS_URL: cannot read the nodes that have metrics: ")
