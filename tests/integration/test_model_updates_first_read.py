"""A restarted worker's first read of model-updates, on the real broker and Redis: every version ever announced
is on the topic, the registry has trimmed the oldest. Cold starts are held until the newest version of each key
is in use (it may be in use sooner: once its own partition is read to its end); the trimmed versions are neither
looked for nor warned about."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import pytest
from test_model_updates_tombstone import KEY, register, send

from app.config import Settings
from app.contracts import encode
from app.streams.feedback_models import ModelCache, follow_model_updates

pytestmark = pytest.mark.integration


async def test_cold_starts_wait_for_the_newest_models_and_old_versions_are_not_loaded(
        kafka_settings: Settings, redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    s = dataclasses.replace(kafka_settings, redis_url=redis_url, model_keep=2)
    updates = [await asyncio.to_thread(register, s) for _ in range(5)]  # v1 and v2 trimmed since
    await send(s, [(KEY.encode(), encode("model-updates", u)) for u in updates])
    caplog.set_level(logging.INFO, logger="app.streams.feedback_models")
    cache = ModelCache(s)
    swaps: list[tuple[str, int]] = []
    asked_without_model: list[bool] = []  # a cold start could be asked for the key: settled, and no model announced
    cache.on_swap.append(lambda k, v: swaps.append((k, v)))
    started = time.monotonic()
    follow = asyncio.create_task(follow_model_updates(s, cache))
    try:
        deadline = started + 20.0
        while not cache.settled():
            asked_without_model.append(cache.settled() and not cache.has(KEY))
            assert not follow.done() and time.monotonic() < deadline, "model-updates not read in 20 s"
            await asyncio.sleep(0.01)
        settled_s = time.monotonic() - started
        assert cache.version(KEY) == updates[-1]["version"] and cache.has(KEY)
    finally:
        follow.cancel()
    assert asked_without_model and not any(asked_without_model)  # no cold start could be asked before it loaded
    assert swaps == [(KEY, updates[-1]["version"])]
    assert not [r for r in caplog.records if "not loaded" in r.getMessage()]
    assert settled_s < 10.0, settled_s
    print(f"first read settled after {settled_s:.2f} s")
