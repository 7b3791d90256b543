"""Every Redis client of the app is built by app.redis_client, with explicit timeouts (redis-py's default is none
before 8.0): no other ``from_url`` or ``Redis(...)`` of redis-py in app/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from app.config import Settings
from app.redis_client import DEFAULT_TIMEOUT_S, async_redis_client, redis_client, settings_redis

APP = Path(__file__).resolve().parents[2] / "app"
FACTORY = APP / "redis_client.py"
# Not this change's to edit (app/streams is another's): the worker's RedisWriter, to be switched to the factory.
def redis_clients_built(path: Path) -> list[int]:
    """Lines of ``path`` that build a redis-py client: ``<redis thing>.from_url(...)``, ``Redis(...)``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "from_url" and "redis" in ast.unparse(func.value).lower():
            lines.append(node.lineno)
        elif ast.unparse(func).split(".")[-1] in ("Redis", "StrictRedis"):
            lines.append(node.lineno)
    return lines


def test_no_redis_client_is_built_outside_the_factory() -> None:
    found = {str(p.relative_to(APP)): lines for p in sorted(APP.rglob("*.py"))
             if p != FACTORY and (lines := redis_clients_built(p))}
    assert found == {}


def test_the_clients_carry_the_timeouts() -> None:
    settings = Settings.from_env({"REDIS_URL": "redis://127.0.0.1:6379/0", "RTT_REDIS_TIMEOUT_S": "2.5"})
    for client in (redis_client("redis://127.0.0.1:6379/0", 2.5), async_redis_client("redis://x:1/0", 2.5),
                   settings_redis(settings)):
        kw = client.connection_pool.connection_kwargs
        assert (kw["socket_timeout"], kw["socket_connect_timeout"]) == (2.5, 2.5)
    assert Settings().redis_timeout_s == DEFAULT_TIMEOUT_S
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        redis_client("redis://127.0.0.1:6379/0", 0.0)
