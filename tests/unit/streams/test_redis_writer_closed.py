"""The worker's Redis cache writer (:class:`app.streams.feedback_weights.RedisWriter`) is closed as the worker's app
stops, on a real redis-server: its connection leaves the server's client list, and a period that ends after it writes
nothing (its client is not opened again). Before, nothing called :meth:`RedisWriter.close` and the connection stayed
open until the process ended."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import redis.asyncio as aioredis

from app.config import Settings
from app.streams.app import create_app
from app.streams.context import context_of
from app.streams.feedback_weights import RedisWriter
from app.streams.options import WorkerOptions

NAME = "rttsched-test-cache-writer"


async def named_clients(url: str) -> int:
    probe = aioredis.from_url(url)
    try:
        return sum(1 for c in await probe.client_list() if c.get("name") == NAME)
    finally:
        await probe.aclose()


async def closed_on_stop(settings: Settings, tmp_path: Path) -> None:
    app = create_app(settings, id="closes-its-writer", options=WorkerOptions.from_settings(settings,
                                                                                          datadir=str(tmp_path)))
    loop = context_of(app).handles["feedback"]
    writers = loop.handles["redis_writer"]
    # as the node-weights period makes it on its first tick
    writer = RedisWriter(settings.redis_client_url, settings.topic_prefix, loop.options.feedback_redis_timeout_s,
                         loop.metrics.feedback, loop.health)
    writers.append(writer)
    await writer.client.client_setname(NAME)
    assert writer.submit([], [{"node": "n1", "weight": 0.5}])
    await asyncio.sleep(0.5)
    assert await writer.client.get(writer.keys.weights("n1")) is not None
    assert await named_clients(settings.redis_client_url) == 1

    await app.stop()

    assert await named_clients(settings.redis_client_url) == 0, "the writer's connection is still open"
    assert not writer.submit([], [{"node": "n1", "weight": 0.25}])  # a period ending after the stop: nothing
    await asyncio.sleep(0.2)
    assert await named_clients(settings.redis_client_url) == 0


def test_the_redis_cache_writer_is_closed_when_the_workers_app_stops(
        settings_factory: Callable[..., Settings], redis_url: str, tmp_path: Path) -> None:
    asyncio.run(closed_on_stop(settings_factory(redis_url=redis_url), tmp_path))
