"""A Redis that takes connections and never answers (SIGSTOP): every Redis client the app builds fails its call
within ``RTT_REDIS_TIMEOUT_S`` (here 0.5 s), as Redis being away, instead of waiting forever."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_stack import RedisServer
from redis.exceptions import RedisError

from app.bridge.attribution import known_nodes
from app.config import Settings
from app.errors import ConfigError
from app.extender.boosters import BoosterUnavailable, registry_boosters
from app.model.errors import RegistryUnavailableError
from app.redis_client import DEFAULT_TIMEOUT_S, settings_redis
from app.registry.store import open_store
from app.scheduler.cache import CacheKeys, load_running

pytestmark = pytest.mark.integration

TIMEOUT_S = 0.5
# A call takes TIMEOUT_S, 2 x TIMEOUT_S at most (connect, then wait for the answer). A client built without
# RTT_REDIS_TIMEOUT_S waits the 5 s default of redis-py 8 and of RTT_REDIS_TIMEOUT_S at least (forever before
# redis-py 8): the bound lies between, clear of both.
BOUND_S = DEFAULT_TIMEOUT_S - 1.0


@pytest.fixture
def frozen(tmp_path: Path) -> Iterator[Settings]:
    server = RedisServer(tmp_path, persist=False).start()
    server.freeze()
    try:
        yield Settings.from_env({}, redis_url=server.url, redis_timeout_s=TIMEOUT_S, models_dir=str(tmp_path))
    finally:
        server.stop()


def test_the_model_registry_fails_fast(frozen: Settings) -> None:
    """The store of the worker's model cache, the trainer and the extender's model loads; /explain's boosters."""
    store = open_store(frozen)
    t0 = time.monotonic()
    with pytest.raises(RegistryUnavailableError, match="Timeout"):
        store.current("gCTF:gpu")
    assert time.monotonic() - t0 < BOUND_S
    boosters = registry_boosters(frozen)
    t0 = time.monotonic()
    with pytest.raises(BoosterUnavailable):
        boosters.get("gCTF:gpu", 1)
    assert time.monotonic() - t0 < BOUND_S


def test_the_scheduler_cache_clients_fail_fast(frozen: Settings) -> None:
    """The client of the extender's warm start and running-pods view, the bridge's and the pods watcher's; the
    publisher's known-nodes check."""

    async def go() -> None:
        client = settings_redis(frozen)
        try:
            t0 = time.monotonic()
            with pytest.raises(RedisError):
                await asyncio.wait_for(load_running(client, CacheKeys("")), 30)
            assert time.monotonic() - t0 < BOUND_S
        finally:
            await client.aclose()
        t0 = time.monotonic()
        with pytest.raises(ConfigError, match="REDIS_URL"):
            await asyncio.wait_for(known_nodes(frozen.redis_url, "", (), frozen.redis_timeout_s), 30)
        assert time.monotonic() - t0 < BOUND_S

    asyncio.run(go())
