"""One contract for every model store: the directory store and the Redis store pass the same checks."""

from __future__ import annotations

import concurrent.futures
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
import redis
import xgboost

from app.clock import ManualClock
from app.model.errors import CurrentChangedError, IntegrityError, ModelNotFoundError, RegistryError
from app.model.train import booster_to_bytes
from app.registry.base import ModelRecord, ModelStore
from app.registry.directory import DirectoryModelStore
from app.registry.redis_store import RedisModelStore
from app.registry.store import load_predictor, open_store

pytestmark = pytest.mark.integration

KEY = "gCTF:gpu"
FEATURES = ("nvidia_smi_utilization_gpu__mean", "cpu_iowait__max")


@pytest.fixture(params=["directory", "redis"])
def store(request, tmp_path: Path):
    clock = ManualClock(1_700_000_000.0)
    if request.param == "directory":
        yield DirectoryModelStore(tmp_path / "models", keep=3, clock=clock)
        return
    url = request.getfixturevalue("redis_url")
    s = RedisModelStore(url, keep=3, namespace=f"t{uuid.uuid4().hex[:10]}", clock=clock)
    yield s
    s.close()


def tamper(store: ModelStore, key: str, version: int) -> None:
    """Flip bytes of a stored blob behind the store's back."""
    if isinstance(store, DirectoryModelStore):
        path = store.path / key / f"{version}.ubj"
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0xFF
        path.write_bytes(bytes(raw))
    else:
        assert isinstance(store, RedisModelStore)
        store.client.setrange(f"{store.namespace}:model:{key}:blob:{version}", 0, b"X")


def save(store: ModelStore, blob: bytes, key: str = KEY, **kw) -> ModelRecord:
    args = {"fmt": "ubj", "features": FEATURES, "params": {"max_depth": np.int64(8)},
            "metrics": {"rmse_ms": 12.5, "mape": float("nan")}, "n_samples": 1000}
    args.update(kw)
    return store.save(key, blob, **args)


def test_versions_increase_and_save_does_not_promote(store):
    r1 = save(store, b"one")
    r2 = save(store, b"two", training_window=(10.0, 20.0))
    assert (r1.version, r2.version) == (1, 2)
    assert store.current(KEY) is None, "save registers a challenger, only promote makes it current"
    with pytest.raises(ModelNotFoundError, match="no current version"):
        store.load(KEY)
    blob, rec = store.load(KEY, 2)
    assert blob == b"two"
    assert rec == r2
    assert rec.features == FEATURES
    assert rec.params == {"max_depth": 8}
    assert rec.metrics == {"rmse_ms": 12.5}, "non-finite metrics are dropped (model-updates has no NaN)"
    assert rec.training_window == (10.0, 20.0)
    assert rec.created_ts == 1_700_000_000.0
    assert len(rec.sha256) == 64 and rec.location
    assert ModelRecord.from_dict(rec.to_dict()) == rec
    assert store.keys() == [KEY]


def test_keeps_the_last_k_versions_and_the_current_one(store):
    for i in range(1, 4):
        save(store, f"v{i}".encode())
    store.promote(KEY, 1)
    for i in range(4, 7):
        save(store, f"v{i}".encode())
    assert [r.version for r in store.versions(KEY)] == [1, 4, 5, 6], "current v1 survives beyond keep=3"
    for gone in (2, 3):
        with pytest.raises(ModelNotFoundError):
            store.load(KEY, gone)
    store.promote(KEY, 6)
    assert [r.version for r in store.versions(KEY)] == [4, 5, 6]
    assert store.load(KEY)[0] == b"v6"
    assert save(store, b"v7").version == 7, "versions are never reused"


def test_promote_and_rollback(store):
    for i in range(1, 4):
        save(store, f"v{i}".encode())
    assert store.promote(KEY, 3).version == 3
    assert store.current(KEY).version == 3
    assert store.rollback(KEY).version == 2
    assert store.load(KEY)[0] == b"v2"
    assert store.rollback(KEY).version == 1
    with pytest.raises(ModelNotFoundError, match="no version older than 1"):
        store.rollback(KEY)
    assert store.rollback(KEY, to_version=3).version == 3
    with pytest.raises(ModelNotFoundError):
        store.promote(KEY, 42)
    assert store.current(KEY).version == 3, "a failed promote changes nothing"


def test_promotion_is_compare_and_set_on_the_current_version(store):
    """``replacing``: the pointer moves only from the version the caller decided against (0: none); a save that
    promotes is refused before it stores anything."""
    for i in range(1, 4):
        save(store, f"v{i}".encode())
    assert store.promote(KEY, 1, replacing=0).version == 1
    with pytest.raises(CurrentChangedError, match="the current version is v1, not none") as err:
        store.promote(KEY, 2, replacing=0)
    assert (err.value.model_key, err.value.expected, err.value.found) == (KEY, 0, 1)
    assert store.promote(KEY, 2, replacing=1).version == 2
    with pytest.raises(CurrentChangedError, match="the current version is v2, not v1"):  # rolled back meanwhile
        store.promote(KEY, 3, replacing=1)
    with pytest.raises(ModelNotFoundError):  # an unknown version is that, whatever the current
        store.promote(KEY, 42, replacing=1)
    with pytest.raises(CurrentChangedError, match="the current version is v2, not v1"):
        save(store, b"v4", replacing=1)
    assert store.current(KEY).version == 2, "a refused promotion changes nothing"
    assert [r.version for r in store.versions(KEY)] == [1, 2, 3], "a refused save stores nothing"

    v4 = save(store, b"v4", replacing=2)  # saved and made current in one step
    assert store.current(KEY) == v4 and store.load(KEY)[0] == b"v4"
    assert v4.version in (4, 5)  # a Redis store spent version 4 on the refused save: never reused
    assert [r.version for r in store.versions(KEY)] == [2, 3, v4.version]  # keep=3: trimmed as by promote
    assert store.promote(KEY, 3).version == 3, "without replacing: whatever the current"


def test_concurrent_promotions_never_replace_the_same_version(store):
    """Writers each read the current version and promote a new one in its place: each version is replaced at most
    once, so the successful promotions form one chain and none is lost."""
    won: list[tuple[int, int]] = []  # (version replaced, version saved)
    lock = threading.Lock()
    start = threading.Barrier(6)

    def writer(i: int) -> None:
        start.wait()
        for j in range(8):
            current = store.current(KEY)
            replacing = current.version if current is not None else 0
            try:
                saved = save(store, f"w{i}-{j}".encode(), replacing=replacing)
            except CurrentChangedError:
                continue
            with lock:
                won.append((replacing, saved.version))

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        list(pool.map(writer, range(6)))
    chain = sorted(won, key=lambda w: w[1])
    assert chain and chain[0][0] == 0
    assert [replaced for replaced, _ in chain[1:]] == [saved for _, saved in chain[:-1]], chain
    assert store.current(KEY).version == chain[-1][1]


def test_tampered_blob_is_refused(store):
    rec = save(store, booster_to_bytes(xgboost.train({}, xgboost.DMatrix(np.eye(4), label=np.arange(4.0)), 1)))
    store.promote(KEY, rec.version)
    store.load(KEY)
    tamper(store, KEY, rec.version)
    with pytest.raises(IntegrityError) as err:
        store.load(KEY)
    assert err.value.version == rec.version and err.value.expected == rec.sha256
    with pytest.raises(IntegrityError):
        load_predictor(store, KEY)


def test_unknown_keys_and_bad_keys(store):
    with pytest.raises(ModelNotFoundError, match="'upload:cpu'"):
        store.load("upload:cpu")
    with pytest.raises(ModelNotFoundError, match="version 3"):
        store.load("upload:cpu", 3)
    with pytest.raises(ModelNotFoundError):
        store.rollback("upload:cpu")
    assert store.current("upload:cpu") is None
    assert store.versions("upload:cpu") == []
    assert store.keys() == []
    with pytest.raises(RegistryError, match="model key"):
        save(store, b"x", key="../../etc/passwd")
    with pytest.raises(ValueError, match="fmt"):
        save(store, b"x", fmt="pickle")


def test_keys_are_independent(store):
    save(store, b"a1", key="gCTF:gpu")
    save(store, b"b1", key="gCTF:gpu:worker-3")
    save(store, b"a2", key="gCTF:gpu")
    assert store.keys() == ["gCTF:gpu", "gCTF:gpu:worker-3"]
    assert [r.version for r in store.versions("gCTF:gpu:worker-3")] == [1]
    assert store.load("gCTF:gpu:worker-3", 1)[0] == b"b1"


def test_load_predictor_uses_the_record_feature_names(store):
    X = np.random.default_rng(0).normal(size=(50, 2)).astype(np.float32)
    booster = xgboost.train({"max_depth": 2}, xgboost.DMatrix(X, label=X[:, 0] * 100 + 200), 3)
    rec = save(store, booster_to_bytes(booster, "json"), fmt="json")
    store.promote(KEY, rec.version)
    predictor, got = load_predictor(store, KEY)
    assert got.version == rec.version
    assert predictor.feature_names == FEATURES
    np.testing.assert_allclose(predictor.predict(X), booster.inplace_predict(X), rtol=1e-5)


def test_open_store_follows_the_settings(settings_factory, redis_url):
    assert isinstance(open_store(settings_factory()), DirectoryModelStore)
    s = open_store(settings_factory(redis_url=redis_url))
    assert isinstance(s, RedisModelStore)
    s.close()


def test_deployments_with_different_topic_prefixes_keep_their_own_models(settings_factory, redis_url):
    tag = uuid.uuid4().hex[:8]
    a = open_store(settings_factory(redis_url=redis_url, topic_prefix=f"a{tag}-"))
    b = open_store(settings_factory(redis_url=redis_url, topic_prefix=f"b{tag}-"))
    assert isinstance(a, RedisModelStore) and isinstance(b, RedisModelStore) and a.namespace != b.namespace
    a.promote(KEY, a.save(KEY, b"blob-a", fmt="ubj", features=FEATURES, params={}, metrics={}, n_samples=1).version)
    assert a.load(KEY)[0] == b"blob-a"
    with pytest.raises(ModelNotFoundError):
        b.load(KEY)
    a.close()
    b.close()


def test_redis_blob_and_metadata_are_written_together(redis_url):
    ns = f"t{uuid.uuid4().hex[:10]}"
    store = RedisModelStore(redis_url, keep=2, namespace=ns)
    rec = store.save(KEY, b"blob", fmt="ubj", features=FEATURES, params={}, metrics={}, n_samples=1)
    client = redis.Redis.from_url(redis_url)
    assert client.get(f"{ns}:model:{KEY}:blob:1") == b"blob"
    assert ModelRecord.from_json(client.get(f"{ns}:model:{KEY}:meta:1")) == rec
    assert rec.location.endswith(f"#{ns}:model:{KEY}:blob:1") and rec.location.startswith("redis://127.0.0.1:")
    for _ in range(3):
        store.save(KEY, b"more", fmt="ubj", features=FEATURES, params={}, metrics={}, n_samples=1)
    assert sorted(client.keys(f"{ns}:model:{KEY}:blob:*")) == [f"{ns}:model:{KEY}:blob:{v}".encode() for v in (3, 4)]
    assert sorted(client.keys(f"{ns}:model:{KEY}:meta:*")) == [f"{ns}:model:{KEY}:meta:{v}".encode() for v in (3, 4)]
    client.close()
    store.close()
