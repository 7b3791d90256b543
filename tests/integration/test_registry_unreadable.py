"""A record the registry cannot read, as the services meet it (a real redis-server and a models directory).

An unreadable version that is not current stops nobody: the worker, the extender and the trainer load the current
model past it. An unreadable current record is a RegistryError naming it — not the registry away (nothing to wait
for) and not a missing model: the worker keeps the model it has, the extender does not retry it, the trainer judges
its challenger against it as unusable. Nothing is changed for it: a promotion to it is refused, the pointer stays.
"""

from __future__ import annotations

import math
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xgboost

from app.config import Settings
from app.extender.models import ModelLoadError, registry_loader
from app.model.errors import ModelNotFoundError, RegistryError, RegistryUnavailableError
from app.model.train import booster_to_bytes
from app.registry.base import CorruptRecordError, ModelStore
from app.registry.directory import DirectoryModelStore
from app.registry.redis_store import RedisModelStore
from app.registry.store import load_predictor, open_store, registry_namespace
from app.streams.feedback_models import ModelCache
from app.trainer.registry import ModelRegistry

pytestmark = pytest.mark.integration

KEY = "gCTF:gpu"


@pytest.fixture(params=["directory", "redis"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    if request.param == "directory":
        return Settings.from_env({}, models_dir=str(tmp_path / "models"))
    return Settings.from_env({}, redis_url=request.getfixturevalue("redis_url"),
                             topic_prefix=f"t{uuid.uuid4().hex[:10]}-")


def blob(seed: int) -> bytes:
    X = np.random.default_rng(seed).uniform(0, 100, (32, 1))
    return booster_to_bytes(xgboost.train({"max_depth": 2}, xgboost.DMatrix(X, label=X[:, 0] + seed), 2), "json")


def fill(store: ModelStore) -> list[dict[str, Any]]:
    """Three versions of KEY, the third current; their model-updates fields."""
    out = []
    for seed in (1, 2, 3):
        record = store.save(KEY, blob(seed), fmt="json", features=["a__mean"], params={}, metrics={}, n_samples=32)
        store.promote(KEY, record.version)
        out.append({"model_key": KEY, "version": record.version, "sha256": record.sha256, "features": ["a__mean"]})
    return out


def corrupt(store: ModelStore, settings: Settings, version: int) -> None:
    if isinstance(store, DirectoryModelStore):
        (store.path / KEY / f"{version}.meta.json").write_bytes(b"not json{")
    else:
        assert isinstance(store, RedisModelStore)
        store.client.set(f"{registry_namespace(settings.topic_prefix)}:model:{KEY}:meta:{version}", "not json{")


async def test_an_unreadable_older_version_stops_no_service(settings: Settings) -> None:
    store = open_store(settings)
    updates = fill(store)
    corrupt(store, settings, 2)

    _, record = load_predictor(store, KEY)  # the trainer's champion, as ModelRegistry.champion_metrics loads it
    assert record.version == 3
    predictor = await registry_loader(settings)(updates[2])  # an extender
    assert predictor.feature_names == ("a__mean",)
    cache = ModelCache(settings, store=store)  # a worker
    assert await cache.apply(dict(updates[2])) is True and cache.version(KEY) == 3

    records, unreadable = store.readable_versions(KEY)
    assert [r.version for r in records] == [1, 3] and [e.version for e in unreadable] == [2]
    with pytest.raises(CorruptRecordError, match="^model 'gCTF:gpu' version 2: metadata is not JSON"):
        store.versions(KEY)
    with pytest.raises(CorruptRecordError, match="version 2: metadata is not JSON"):
        store.promote(KEY, 2)
    with pytest.raises(CorruptRecordError, match="version 2: metadata is not JSON"):
        store.rollback(KEY)  # back to v2: refused, the pointer stays
    assert store.current(KEY).version == 3  # type: ignore[union-attr]


async def test_an_unreadable_current_record_is_a_registry_error_each_service_handles(settings: Settings) -> None:
    store = open_store(settings)
    updates = fill(store)
    corrupt(store, settings, 3)

    for read in (store.current, store.load):
        with pytest.raises(CorruptRecordError, match="^model 'gCTF:gpu' version 3: metadata is not JSON") as exc:
            read(KEY)
        assert isinstance(exc.value, RegistryError)
        assert not isinstance(exc.value, (RegistryUnavailableError, ModelNotFoundError))

    # the trainer: a champion that cannot be loaded, judged unusable (its challenger replaces it)
    metrics = ModelRegistry(store=store).champion_metrics(KEY, None)  # type: ignore[arg-type]  (never scored)
    assert metrics is not None and math.isnan(metrics["rmse_ms"])
    # an extender: a model that cannot be loaded, not a registry away (not retried)
    with pytest.raises(ModelLoadError, match="gCTF:gpu v3: model 'gCTF:gpu' version 3: metadata is not JSON") as err:
        await registry_loader(settings)(updates[2])
    assert err.value.transient is False
    # a worker: keeps the model it has, the update rejected (not deferred to be retried)
    cache = ModelCache(settings, store=store)
    assert await cache.apply(dict(updates[1])) is True
    assert await cache.apply(dict(updates[2])) is False
    assert cache.version(KEY) == 2 and cache.pending == {}
    assert cache.metrics.value("rtt_worker_model_rejected_total", reason="CorruptRecordError") == 1
    await cache.close()


def test_a_redis_key_of_the_wrong_type_is_named(redis_url: str) -> None:
    settings = Settings.from_env({}, redis_url=redis_url, topic_prefix=f"t{uuid.uuid4().hex[:10]}-")
    store = open_store(settings)
    assert isinstance(store, RedisModelStore)
    fill(store)
    ns, r = store.namespace, store.client
    r.delete(f"{ns}:model:{KEY}:blob:1")
    r.hset(f"{ns}:model:{KEY}:blob:1", "a", "b")
    with pytest.raises(CorruptRecordError, match=r"^model 'gCTF:gpu': a Redis key of it holds the wrong kind of "
                                                 r"value: .*WRONGTYPE"):
        store.load(KEY, 1)
    r.delete(f"{ns}:model:{KEY}:meta:3")
    r.hset(f"{ns}:model:{KEY}:meta:3", "a", "b")
    with pytest.raises(CorruptRecordError, match=f"^model 'gCTF:gpu' version 3: its metadata is a Redis hash, not a "
                                                 f"string \\({ns}:model:gCTF:gpu:meta:3\\)$"):
        store.current(KEY)
    r.delete(f"{ns}:model:{KEY}:current")
    r.rpush(f"{ns}:model:{KEY}:current", "3")
    with pytest.raises(CorruptRecordError, match="^model 'gCTF:gpu': its current version is a Redis list, not a "
                                                 "string"):
        store.load(KEY)
    r.delete(f"{ns}:models")
    r.set(f"{ns}:models", "x")
    with pytest.raises(RegistryError, match=f"{ns}:models, the set of model keys, is a Redis string, not a set$"):
        store.keys()
    assert store.load(KEY, 2)[1].version == 2  # what is not broken still reads
    store.close()
