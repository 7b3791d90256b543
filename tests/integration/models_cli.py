"""What the tests of ``rttsched models`` on a registry of the test's own share: the registry (a real redis-server or
a models directory) with the environment that points ``rttsched`` at it, and the command run in this process."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from app.cli.main import main
from app.config import Settings
from app.registry.base import ModelStore
from app.registry.redis_store import RedisModelStore
from app.registry.store import open_store


@contextmanager
def registry_for_cli(request: pytest.FixtureRequest, kafka_settings: Settings, tmp_path: Path,
                     monkeypatch: pytest.MonkeyPatch) -> Iterator[ModelStore]:
    """The registry ``request.param`` names (``redis``: the test's redis-server, its namespace the test's topic
    prefix, a registry of its own; else a models directory under ``tmp_path``), opened as ``rttsched`` opens it once
    the environment points it there and at the test's broker and topics; a Redis store closed at the end."""
    monkeypatch.setenv("RTT_KAFKA_BOOTSTRAP", kafka_settings.bootstrap_servers)
    monkeypatch.setenv("RTT_TOPIC_PREFIX", kafka_settings.topic_prefix)
    if request.param == "redis":
        monkeypatch.setenv("REDIS_URL", request.getfixturevalue("redis_url"))
    else:
        monkeypatch.delenv("REDIS_URL", raising=False)
        monkeypatch.setenv("RTT_MODELS_DIR", str(tmp_path / "models"))
    store = open_store(Settings.from_env())
    yield store
    if isinstance(store, RedisModelStore):
        store.close()


def models_cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Awaitable[tuple[int, str, str]]]:
    """``rttsched models ARGS`` in this process (in a thread: it runs its own event loop): exit status, stdout,
    stderr (what ``capsys`` held before it is dropped)."""

    async def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        rc = await asyncio.to_thread(main, ["models", *argv])
        out, err = capsys.readouterr()
        return rc, out, err

    return run
