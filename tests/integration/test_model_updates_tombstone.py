"""A model-updates tombstone (a key, no value) and a record without key, on the real broker, read by the readers of
model-updates that take it from its start: the worker's model cache, the trainer, the live run's watcher and the
scripted reader of tests and benches.

Deleting a model is not supported: a tombstone is counted under its own label, logged at INFO at most, and the
model keeps serving. A record without key is refused, as any record whose key is not its model key.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from aiokafka import AIOKafkaProducer

from app.config import Settings
from app.contracts import encode
from app.model.train import booster_to_bytes, train_model
from app.registry.store import open_store
from app.sim.live_watch import FeedbackWatcher
from app.sim.scripted import Reader
from app.streams.feedback_models import ModelCache, follow_model_updates
from app.trainer.service import TrainerService

pytestmark = pytest.mark.integration

KEY = "gCTF:gpu"
FEATURES = ("load__mean", "hw_gpu_fp32_tflops")


def register(settings: Settings) -> dict[str, Any]:
    """A small real model of ``KEY``, saved and promoted; its model-updates value."""
    rng = np.random.default_rng(7)
    load, tflops = rng.uniform(0, 1, 300), rng.choice([3.52, 7.0, 82.6], 300)
    result = train_model(np.column_stack([load, tflops]).astype(np.float32), 50.0 + 400.0 * load + 2000.0 / tflops,
                         FEATURES, "gpu")
    store = open_store(settings)
    rec = store.save(KEY, booster_to_bytes(result.booster), fmt="ubj", features=FEATURES, params=result.params,
                     metrics=result.metrics, n_samples=300)
    store.promote(KEY, rec.version)
    return {"model_key": KEY, "version": rec.version, "sha256": rec.sha256, "features": list(rec.features),
            "metrics": rec.metrics, "location": rec.location, "format": "ubj", "ts": time.time()}


async def send(settings: Settings, records: list[tuple[bytes | None, bytes | None]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(settings.topic("model-updates"), value, key=key)
    finally:
        await producer.stop()


async def until(done: Callable[[], Any], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"{what} not seen in {timeout_s}s"
        await asyncio.sleep(0.05)


async def test_a_tombstone_deletes_no_model_and_is_counted_as_one(kafka_settings: Settings, redis_url: str,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    s = dataclasses.replace(kafka_settings, redis_url=redis_url)
    update = await asyncio.to_thread(register, s)
    await send(s, [(KEY.encode(), encode("model-updates", update)),
                   (KEY.encode(), None),                      # the tombstone of a model in service
                   (b"upload:cpu", None),                     # of a key never announced
                   (None, encode("model-updates", update))])  # no key
    caplog.set_level(logging.INFO)

    # the worker's model cache: the model serves; two tombstones and a key mismatch counted
    cache = ModelCache(s)
    follow = asyncio.create_task(follow_model_updates(s, cache))
    reg = cache.metrics.registry
    rejected = "rtt_worker_model_rejected_total"
    await until(lambda: reg.get_sample_value(rejected, {"reason": "key_mismatch"}) == 1.0 and cache.version(KEY)
                and reg.get_sample_value(rejected, {"reason": "tombstone"}) == 2.0, "the worker's four records")
    await asyncio.sleep(0.5)
    assert cache.version(KEY) == update["version"] and cache.predictor(KEY) is not None
    assert reg.get_sample_value(rejected, {"reason": "empty"}) is None
    assert not follow.done()
    follow.cancel()

    # the trainer: what was announced stays known; the same counts, under its bad-messages series
    trainer = TrainerService(s, catch_up_timeout_s=5.0, registry_check_s=0)
    async with trainer:
        bad = "rtt_trainer_bad_messages_total"
        treg = trainer.metrics.registry
        await until(lambda: treg.get_sample_value(bad, {"topic": "model-updates", "reason": "key_mismatch"}) == 1.0
                    and treg.get_sample_value(bad, {"topic": "model-updates", "reason": "tombstone"}) == 2.0
                    and trainer.announced, "the trainer's four records")
        assert trainer.announced == {KEY: (update["version"], update["sha256"])}
        assert trainer.crashed is not None and not trainer.crashed.is_set()

    # the live run's watcher: one model update; the record without key refused; tombstones apart
    watcher = FeedbackWatcher(s, ("model-updates",)).start()
    try:
        await until(lambda: watcher.rejected + watcher.tombstones + len(watcher.models) == 4, "the watcher's four"
                    " records")
        assert [(k, v) for _, k, v in watcher.models] == [(KEY, update["version"])]
        assert (watcher.rejected, watcher.tombstones) == (1, 2)
    finally:
        await asyncio.to_thread(watcher.close)

    # the scripted reader reads on past the tombstones
    async with Reader(s, "model-updates") as reader:
        await until(lambda: len(reader.values) == 2 and len(reader.tombstones) == 2, "the reader's four records")
        assert reader.state() == "reading" and sorted(reader.tombstones) == [KEY.encode(), b"upload:cpu"]

    tombstone_logs = [r for r in caplog.records if "tombstone" in r.getMessage()]
    assert len(tombstone_logs) == 4 and all(r.levelno <= logging.INFO for r in tombstone_logs)
