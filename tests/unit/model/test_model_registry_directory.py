"""The directory store's own promises (the shared contract runs in tests/integration/test_registry_redis.py)."""

from __future__ import annotations

import concurrent.futures

import pytest

from app.clock import ManualClock
from app.model.errors import IntegrityError, ModelNotFoundError
from app.registry.base import ModelRecord, versions_to_drop
from app.registry.directory import DirectoryModelStore
from app.registry.store import open_store

KEY = "Motioncor2:gpu"


def save(store: DirectoryModelStore, blob: bytes, fmt: str = "ubj", key: str = KEY) -> ModelRecord:
    return store.save(key, blob, fmt=fmt, features=["a__mean"], params={}, metrics={"mae_ms": 1.0}, n_samples=3)


def test_layout_on_disk(tmp_path):
    store = DirectoryModelStore(tmp_path, keep=2, clock=ManualClock(5.0))
    r1 = save(store, b"ubj-blob")
    save(store, b'{"json": 1}', fmt="json")
    store.promote(KEY, 1)
    d = tmp_path / KEY
    assert sorted(p.name for p in d.iterdir()) == [".lock", "1.meta.json", "1.ubj", "2.json", "2.meta.json", "CURRENT"]
    assert (d / "1.ubj").read_bytes() == b"ubj-blob"
    assert ModelRecord.from_json((d / "1.meta.json").read_bytes()) == r1
    assert r1.location == str((d / "1.ubj").resolve())
    assert (d / "CURRENT").read_text() == "1"
    assert store.load(KEY, 2)[0] == b'{"json": 1}'


def test_a_blob_without_metadata_is_not_a_version(tmp_path):
    store = DirectoryModelStore(tmp_path)
    save(store, b"one")
    (tmp_path / KEY / "2.ubj").write_bytes(b"half-written")  # a crash between blob and metadata
    (tmp_path / KEY / ".2.meta.json.123.tmp").write_bytes(b"{")
    assert [r.version for r in store.versions(KEY)] == [1]
    with pytest.raises(ModelNotFoundError):
        store.load(KEY, 2)
    assert save(store, b"two").version == 2
    assert store.load(KEY, 2)[0] == b"two"


def test_a_blob_whose_metadata_was_removed_goes_with_the_versions_trimmed_after_it(tmp_path):
    store = DirectoryModelStore(tmp_path, keep=2)
    save(store, b"one")
    store.promote(KEY, 1)
    (tmp_path / KEY / "1.meta.json").unlink()  # removed by hand: the current version has no metadata
    assert save(store, b"two").version == 2
    assert (tmp_path / KEY / "1.ubj").exists()  # still the current version's blob
    store.promote(KEY, 2)
    for blob in (b"three", b"four", b"five"):
        save(store, blob)
    assert sorted(p.name for p in (tmp_path / KEY).iterdir() if not p.name.startswith(".")) == [
        "2.meta.json", "2.ubj", "4.meta.json", "4.ubj", "5.meta.json", "5.ubj", "CURRENT"]


def test_truncated_blob_is_refused(tmp_path):
    store = DirectoryModelStore(tmp_path)
    save(store, b"0123456789")
    store.promote(KEY, 1)
    (tmp_path / KEY / "1.ubj").write_bytes(b"01234")
    with pytest.raises(IntegrityError, match="refusing to load"):
        store.load(KEY)


def test_missing_blob_is_not_found(tmp_path):
    store = DirectoryModelStore(tmp_path)
    save(store, b"x")
    (tmp_path / KEY / "1.ubj").unlink()
    with pytest.raises(ModelNotFoundError, match="version 1"):
        store.load(KEY, 1)


def test_concurrent_writers_get_distinct_versions(tmp_path):
    store = DirectoryModelStore(tmp_path, keep=100)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        versions = list(pool.map(lambda i: save(store, f"b{i}".encode()).version, range(30)))
    assert sorted(versions) == list(range(1, 31))
    for v in versions:
        store.load(KEY, v)


def test_keep_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="keep"):
        DirectoryModelStore(tmp_path, keep=0)


def test_versions_to_drop_never_drops_the_newest_or_current():
    assert versions_to_drop([], None, 3) == []
    assert versions_to_drop([1, 2], None, 3) == []
    assert versions_to_drop([1, 2, 3, 4], None, 1) == [1, 2, 3]
    assert versions_to_drop([1, 2, 3, 4], 1, 1) == [2, 3]
    assert versions_to_drop([1, 2, 3, 4], 4, 1) == [1, 2, 3]


def test_open_store_without_redis_uses_models_dir(settings_factory):
    settings = settings_factory()
    store = open_store(settings)
    assert isinstance(store, DirectoryModelStore)
    assert store.path == settings.models_path
