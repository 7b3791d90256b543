"""The bridge's GPU hang check reads the started pods of the view ``rttsched pods`` writes, in a real Redis."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from app.bridge.running import RunningPods
from app.extender.podwatch_view import encode_node
from app.scheduler.cache import CacheKeys, load_running, store_running

pytestmark = pytest.mark.integration


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[Any]:
    client = aioredis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_pods_pulling_their_image_or_shutting_down_are_no_gpu_work_for_the_bridge(redis_client):
    keys = CacheKeys(f"t{uuid.uuid4().hex[:8]}-")
    # gpu-pulling: one gCTF pod bound, its image being pulled; gpu-busy: one started, one terminating
    await redis_client.set(keys.running("gpu-pulling"), encode_node({"apps": {"gCTF": 1}, "started": {}}, 1.0))
    await redis_client.set(keys.running("gpu-busy"),
                           encode_node({"apps": {"gCTF": 2}, "started": {"gCTF": 1}}, 1.0))
    await store_running(redis_client, keys, "gpu-old", {"Motioncor2": 2}, 1.0)  # an older watcher: no "started"
    await redis_client.set(keys.running("gpu-junk"), b'{"started": 3}')
    view = RunningPods(redis_client, keys, gpu_apps=("gCTF", "Motioncor2"), refresh_s=5.0, now=lambda: 0.0)
    assert await view.refresh()
    assert [view.gpu_pods(n) for n in ("gpu-pulling", "gpu-busy", "gpu-old", "gpu-junk")] == [0, 1, 2, 0]
    assert (await load_running(redis_client, keys))["gpu-busy"] == {"gCTF": 2}  # the extender counts both
