"""The worker's Redis degraded line names the Redis it cannot write to (its password masked) and the setting,
``REDIS_URL``, as the trainer's does; it used to say only ``redis cache write failed: network:ConnectionError``."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry

from app.streams.feedback_metrics import FeedbackMetrics
from app.streams.feedback_weights import RedisWriter
from app.streams.health import Health


async def test_the_redis_degraded_line_names_the_address_and_its_setting(caplog: pytest.LogCaptureFixture) -> None:
    health = Health()
    writer = RedisWriter("redis://:hunter2@127.0.0.1:1/0", "rtt", 1.0, FeedbackMetrics(CollectorRegistry()), health)
    try:
        with caplog.at_level(logging.WARNING, logger="app.streams"):
            writer.submit([{"node": "n1"}], [])
            assert writer._task is not None
            await writer._task
            writer.submit([{"node": "n1"}], [])
            await writer._task
    finally:
        await writer.close()
    lines = [r.getMessage() for r in caplog.records if "degraded (redis_cache)" in r.getMessage()]
    assert len(lines) == 1  # once per change, as before
    assert "redis://:***@127.0.0.1:1/0" in lines[0] and "REDIS_URL" in lines[0], lines[0]
    assert "hunter2" not in lines[0] and "hunter2" not in health.status()["degraded"]["redis_cache"]
