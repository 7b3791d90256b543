"""The models of an app the worker retired, with the registry in a real Redis: unloaded, the announced version kept,
loaded again (sha256 checked) from Redis when the app is named again — the newest announced meanwhile included."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from test_model_updates_tombstone import KEY, register

from app.config import Settings
from app.registry.store import open_store
from app.streams.feedback_models import ModelCache
from app.streams.health import Health
from app.streams.metrics import WorkerMetrics

pytestmark = pytest.mark.integration


async def test_a_retired_app_s_models_are_loaded_again_from_redis(settings_factory: Callable[..., Settings],
                                                                  redis_url: str) -> None:
    s = settings_factory(redis_url=redis_url)
    v1 = await asyncio.to_thread(register, s)
    metrics = WorkerMetrics()
    cache = ModelCache(s, metrics=metrics, health=Health(metrics.registry))
    assert await cache.apply(v1) and cache.apps() == {"gCTF"}

    assert cache.park({"gCTF"}) == [KEY]
    assert cache.predictor(KEY) is None and cache.apps() == set() and not cache.has(KEY)
    assert metrics.registry.get_sample_value("rtt_worker_model_version", {"model_key": KEY}) is None
    v2 = await asyncio.to_thread(register, s)  # announced while the app is retired: kept, not loaded
    assert not await cache.apply(v2) and cache.predictor(KEY) is None
    assert cache.parked == {KEY: {"model_key": KEY, "version": v2["version"], "sha256": v2["sha256"]}}

    updates = cache.unpark("gCTF")
    assert cache.has(KEY) and cache.unpark("gCTF") == []
    assert [await cache.apply(u) for u in updates] == [True]
    assert cache.version(KEY) == v2["version"] and not cache.returning and not cache.parked
    assert open_store(s).current(KEY).sha256 == v2["sha256"]
    await cache.close()
