"""A training sample dated beyond the trainer's clock plus ``RTT_MAX_CLOCK_SKEW_S`` (a node's clock run ahead, a
producer's bad ``started_ts``: the schema takes up to 1e11) is dead-lettered ``ts_in_future`` and kept out of the
key's history — newest in time, it would sit in every holdout of the key. An old one is the history itself and
stays. On the real broker and a real Redis."""

from __future__ import annotations

import base64
import dataclasses
import json
import time
import uuid

import numpy as np
import pytest
from test_trainer import KEY, dead_letters, produce, samples, wait_for

from app.config import Settings
from app.contracts import encode
from app.registry.redis_store import RedisModelStore
from app.trainer.registry import ModelRegistry
from app.trainer.service import TrainerService

pytestmark = pytest.mark.integration


async def test_a_sample_from_the_future_is_dead_lettered_and_kept_out_of_the_history(
        kafka_settings: Settings, redis_url: str) -> None:
    settings = dataclasses.replace(kafka_settings, redis_url=redis_url, max_clock_skew_s=300.0)
    rows = samples(5, 0, np.random.default_rng(6))  # started in 2023: old, and kept
    now = time.time()
    rows[1] = {**rows[1], "started_ts": 1e11}  # the schema's limit: year 5138
    rows[3] = {**rows[3], "started_ts": now + 3_600.0}  # a node clock an hour ahead
    rows[4] = {**rows[4], "started_ts": now + 60.0}  # within the skew allowed: kept
    await produce(settings, "training-samples", [(KEY, encode("training-samples", s)) for s in rows])
    store = RedisModelStore(redis_url, namespace=f"t{uuid.uuid4().hex[:10]}")
    service = TrainerService(settings, registry=ModelRegistry(store=store), catch_up_timeout_s=15.0,
                             registry_check_s=0)
    async with service:
        reg = service.metrics.registry
        await wait_for(lambda: reg.get_sample_value("rtt_trainer_bad_messages_total", {
            "topic": "training-samples", "reason": "ts_in_future"}) == 2.0 and service.history.count(KEY) == 3,
            15.0, "the samples read")
        letters = await dead_letters(settings, 2)
        assert sorted((d["offset"], d["reason"]) for d in letters) == [(1, "ts_in_future"), (3, "ts_in_future")]
        assert all("ahead of this clock" in d["error"] for d in letters)
        assert sorted(json.loads(base64.b64decode(d["raw"]))["task_id"] for d in letters) == ["task-1", "task-3"]
        held = service.history.dataset(KEY).ts.tolist()
        assert sorted(held) == sorted([rows[0]["started_ts"], rows[2]["started_ts"], rows[4]["started_ts"]])
    store.close()
