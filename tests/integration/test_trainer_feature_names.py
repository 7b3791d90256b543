"""Training samples a model cannot take, from a hostile or broken producer, on the real broker and a real Redis.

A sample with a feature name XGBoost refuses (``gpu_util[0]``) used to enter its key's history and fail every
retrain of the key (a traceback per retrain, until the key was idle for a day; a restarted trainer read it back
and failed again). Samples with thousands of names used to fill the key's vocabulary first come, first kept (a
WARNING per name and sample), so later samples lost their real features and a model of junk was promoted. Now the
contract refuses both at admission and the trainer sends them to dead-letters with their reason, counted; a flood
below the contract's limit that would push the key's vocabulary past its cap is refused whole, one line a sample.
The key trains on its good samples."""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import time
import uuid

import numpy as np
import orjson
import pytest
from aiokafka import AIOKafkaConsumer
from test_trainer import FAST, KEY, dead_letters, drain, event, produce, samples, updates, wait_for

from app.config import Settings
from app.contracts import encode
from app.registry.redis_store import RedisModelStore
from app.trainer.history import MAX_FEATURES_PER_KEY
from app.trainer.registry import ModelRegistry
from app.trainer.service import TrainerService

pytestmark = pytest.mark.integration
__all__ = ["updates"]  # the model-updates fixture of test_trainer.py

FLOOD_KEY = "flood:cpu"


def flood(i: int, n: int, key: str = FLOOD_KEY) -> dict[str, object]:
    return {"model_key": key, "task_id": f"fl-{i}", "app": key.split(":")[0], "node": "n1", "node_class": "cpu",
            "started_ts": 1_700_000_000.0 + i, "rtt_ms": 100.0 + i,
            "features": {f"f{i}_{j}_{'x' * 20}": 0.5 for j in range(n)}}


async def test_unsafe_names_and_floods_are_dead_lettered_and_the_key_trains_on_the_rest(
        kafka_settings: Settings, redis_url: str, updates: AIOKafkaConsumer, caplog: pytest.LogCaptureFixture) -> None:
    settings = dataclasses.replace(kafka_settings, redis_url=redis_url)
    good = samples(300, 0, np.random.default_rng(4))
    bad_name = {**good[0], "task_id": "bad-name", "features": {"gpu_util[0]": 50.0, "cpu_iowait__mean": 1.0}}
    too_many = {**good[1], "task_id": "too-many", "features": flood(0, 2_100)["features"]}
    # written as a hostile producer writes them: past this project's encode, which refuses them
    items = [(KEY, orjson.dumps(bad_name)), (KEY, orjson.dumps(too_many))]
    items += [(KEY, encode("training-samples", s)) for s in good]
    # below the contract's limit: the first fills most of the key's vocabulary, the next two would pass its cap
    items += [(FLOOD_KEY, encode("training-samples", flood(i, 1_500))) for i in range(1, 4)]
    items += [(FLOOD_KEY, encode("training-samples", {**flood(4, 0), "features": {"cpu_iowait__mean": 1.0}}))]
    await produce(settings, "training-samples", items)

    caplog.set_level(logging.INFO)
    store = RedisModelStore(redis_url, namespace=f"t{uuid.uuid4().hex[:10]}")
    service = TrainerService(settings, registry=ModelRegistry(store=store), train_params=FAST,
                             catch_up_timeout_s=15.0, registry_check_s=0)
    async with service:
        reg = service.metrics.registry

        def bad(reason: str) -> float:
            return reg.get_sample_value("rtt_trainer_bad_messages_total",
                                        {"topic": "training-samples", "reason": reason}) or 0.0

        await wait_for(lambda: bad("schema") == 2.0 and bad("feature_vocabulary_full") == 2.0
                       and service.history.count(KEY) == 300 and service.history.count(FLOOD_KEY) == 2,
                       20.0, "the samples read")
        letters = await dead_letters(settings, 4, timeout_s=15.0)
        at = {(d["key"], d["offset"]): d for d in letters}  # a flood's raw is cut to its first 64 KiB
        assert sorted(at) == sorted([(KEY, 0), (KEY, 1), (FLOOD_KEY, 1), (FLOOD_KEY, 2)])
        by_task = {"bad-name": at[KEY, 0], "too-many": at[KEY, 1], "fl-2": at[FLOOD_KEY, 1], "fl-3": at[FLOOD_KEY, 2]}
        assert json.loads(base64.b64decode(by_task["bad-name"]["raw"])) == bad_name  # the message kept
        assert by_task["bad-name"]["reason"] == "schema" and "'gpu_util[0]'" in by_task["bad-name"]["error"]
        assert by_task["too-many"]["reason"] == "schema"
        assert "must contain less than or equal to 1600 properties (it has 2,100)" in by_task["too-many"]["error"]
        assert {by_task[t]["reason"] for t in ("fl-2", "fl-3")} == {"feature_vocabulary_full"}
        assert f"more than the {MAX_FEATURES_PER_KEY:,} a key holds" in by_task["fl-2"]["error"]
        await wait_for(lambda: reg.get_sample_value("rtt_trainer_dead_letters_total", {
            "topic": "training-samples", "reason": "schema"}) == 2.0, 10.0, "the dead letters counted")

        # one line a refused sample, none a name; the key keeps its names
        refused = [r for r in caplog.records if "bad training sample" in r.getMessage()]
        assert len(refused) == 4, [r.getMessage()[:200] for r in refused]
        assert not [r for r in caplog.records if "feature names for one key" in r.getMessage()]
        names = service.history.snapshot(KEY)[0]
        assert "gpu_util[0]" not in names and not [n for n in names if n.startswith("f0_")]
        flood_names = service.history.snapshot(FLOOD_KEY)[0]
        assert 1_500 < len(flood_names) <= MAX_FEATURES_PER_KEY and "cpu_iowait__mean" in flood_names

        # the key trains on its good samples: no traceback, a model of its real features announced
        await produce(settings, "retrain-events", [(KEY, event(KEY, "cold_start", onset=time.time()))])
        got = await drain(updates, 60.0)
        assert [(m["model_key"], m["version"]) for m in got] == [(KEY, 1)]
        assert all(n.startswith(("nvidia_smi_", "cpu_", "hw_", "task_")) for n in got[0]["features"]), got[0]
        await wait_for(lambda: any(o.model_key == KEY for o in service.outcomes), 10.0, "the retrain's outcome")
        assert [o.outcome for o in service.outcomes if o.model_key == KEY] == ["promoted"]
        assert not [r for r in caplog.records if r.exc_info or "retrain of" in r.getMessage() and "failed"
                    in r.getMessage()]
    store.close()
