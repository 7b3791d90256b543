"""The worker's Redis cache of the latest node-features and node-weights forgets an evicted node (a real
redis-server): a restarted extender's warm start and ``rttsched publish`` then no longer see it."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis

from app.bridge.attribution import known_nodes
from app.scheduler.cache import CacheKeys
from app.streams.feedback_metrics import FeedbackMetrics
from app.streams.feedback_weights import RedisWriter
from app.streams.health import Health

pytestmark = pytest.mark.integration


def test_an_evicted_node_leaves_the_cache(redis_url: str) -> None:
    from prometheus_client import CollectorRegistry

    prefix = f"f{uuid.uuid4().hex[:8]}-"
    registry = CollectorRegistry()
    metrics = FeedbackMetrics(registry)

    async def run() -> tuple[set[str] | None, set[str] | None, list[bytes]]:
        writer = RedisWriter(redis_url, prefix, 2.0, metrics, Health(registry))
        try:
            features = [{"node": n, "ts": 1.0, "node_class": "cpu", "window_s": 30.0, "count": 1,
                         "features": {}} for n in ("a", "b")]
            weights = [{"node": n, "ts": 1.0, "weight": 1.0, "predicted_rtt_ms": {}, "stale": False}
                       for n in ("a", "b")]
            assert writer.submit(features, weights)
            for _ in range(100):  # the write runs in the background
                before = await known_nodes(redis_url, prefix)
                if before == {"a", "b"}:
                    break
                await asyncio.sleep(0.02)
            await writer.forget(["a"])
            after = await known_nodes(redis_url, prefix)
            client = aioredis.from_url(redis_url)
            try:
                left = sorted(await client.keys(f"*{prefix}*"))
            finally:
                await client.aclose()
            return before, after, left
        finally:
            await writer.close()

    before, after, left = asyncio.run(run())
    assert before == {"a", "b"} and after == {"b"}
    keys = CacheKeys(prefix)
    assert left == sorted(k.encode() for k in (keys.features("b"), keys.weights("b")))
    assert registry.get_sample_value("rtt_worker_redis_writes_total", {"outcome": "ok"}) == 2  # write, delete
