"""A Redis that refuses the password it is given (none, or a wrong one) is named by what gives it:
``RTT_REDIS_PASSWORD_FILE``, saying whether it is set, not only ``REDIS_URL`` -- against a real redis-server
started with ``--requirepass``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fault_stack import RedisServer
from redis_servers import PASSWORD, locked

from app.cli.main import main
from app.config import Settings
from app.errors import ConfigError
from app.redis_client import check_redis

__all__ = ["locked"]  # the fixture, used here


@pytest.fixture
def env(locked: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv("REDIS_URL", locked.url)
    monkeypatch.delenv("RTT_REDIS_PASSWORD_FILE", raising=False)
    monkeypatch.setenv("RTT_KAFKA_BOOTSTRAP", "127.0.0.1:1")  # not reached: the registry fails first
    monkeypatch.setenv("RTT_MODELS_DIR", str(tmp_path / "models"))
    return monkeypatch


def _password_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "redis-password"
    path.write_text(text + "\n")
    return str(path)


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err.strip()


def test_models_without_a_password_names_the_unset_password_file(env, locked, capsys):
    assert main(["models", "list"]) == 2
    line = _error(capsys)
    assert line.startswith(f"rttsched models: error: model registry at {locked.url} unavailable: AuthenticationError")
    assert line.endswith("(RTT_REDIS_PASSWORD_FILE is not set and REDIS_URL has no password: this Redis asks for one)")


def test_models_with_a_wrong_password_file_names_it(env, locked, tmp_path, capsys):
    path = _password_file(tmp_path, "not-the-password")
    env.setenv("RTT_REDIS_PASSWORD_FILE", path)
    assert main(["models", "list"]) == 2
    line = _error(capsys)
    assert line.endswith(f"(RTT_REDIS_PASSWORD_FILE is set ({path}): Redis refused the password in it)")
    assert "not-the-password" not in line


def test_models_with_a_wrong_password_in_the_url_names_both(env, locked, capsys):
    env.setenv("REDIS_URL", locked.url.replace("redis://", "redis://:not-the-password@"))
    assert main(["models", "list"]) == 2
    line = _error(capsys)
    assert line.endswith("(RTT_REDIS_PASSWORD_FILE is not set: Redis refused the password in REDIS_URL)")
    assert "not-the-password" not in line


def test_a_redis_that_is_away_still_names_redis_url(env, locked, capsys):
    locked.stop()
    assert main(["models", "list"]) == 2
    assert _error(capsys).endswith("(REDIS_URL)")


@pytest.mark.parametrize("password", [None, "not-the-password"])
def test_check_redis_names_the_password_file(locked, tmp_path, password):
    env = {"REDIS_URL": locked.url}
    if password is not None:
        env["RTT_REDIS_PASSWORD_FILE"] = _password_file(tmp_path, password)
    with pytest.raises(ConfigError) as exc:
        asyncio.run(check_redis(Settings.from_env(env)))
    assert exc.value.field == "RTT_REDIS_PASSWORD_FILE"
    assert ("is set" if password else "is not set") in exc.value.message
    asyncio.run(check_redis(Settings.from_env({**env, "RTT_REDIS_PASSWORD_FILE": _password_file(tmp_path, PASSWORD)})))
