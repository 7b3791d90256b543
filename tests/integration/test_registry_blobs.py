"""``ModelStore.check_blobs`` on both stores (a real redis-server, a models directory): a version whose record stays
while its blob is gone, holds another kind of value or, read, is not the blob its record names is found and named;
a version trimmed meanwhile (record and blob gone together) is no error; the cheap look reads no blob."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pytest

from app.registry.base import MISSING_BLOB, ModelRecord, ModelStore
from app.registry.directory import DirectoryModelStore
from app.registry.redis_store import RedisModelStore

pytestmark = pytest.mark.integration

KEY = "gCTF:gpu"


@pytest.fixture(params=["directory", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "directory":
        yield DirectoryModelStore(tmp_path / "models", keep=5)
        return
    s = RedisModelStore(request.getfixturevalue("redis_url"), keep=5, namespace=f"t{uuid.uuid4().hex[:10]}")
    yield s
    s.close()


def saved(store: ModelStore, n: int = 3) -> list[ModelRecord]:
    out = []
    for i in range(n):
        out.append(store.save(KEY, f"blob-{i + 1}".encode(), fmt="json", features=["a"], params={}, metrics={},
                              n_samples=1, replacing=i))
    return out


def blob_at(store: ModelStore, version: int) -> str:
    """Where ``store`` keeps the blob of ``KEY``'s ``version``: a Redis key or a file."""
    if isinstance(store, RedisModelStore):
        return f"{store.namespace}:model:{KEY}:blob:{version}"
    assert isinstance(store, DirectoryModelStore)
    return str(store.path / KEY / f"{version}.json")


def remove(store: ModelStore, version: int, meta_too: bool = False) -> None:
    """Delete the blob of ``version`` behind the store's back (and its metadata: as a trim does)."""
    if isinstance(store, RedisModelStore):
        store.client.delete(blob_at(store, version))
        if meta_too:
            store.client.delete(f"{store.namespace}:model:{KEY}:meta:{version}")
        return
    Path(blob_at(store, version)).unlink()
    if meta_too:
        assert isinstance(store, DirectoryModelStore)
        (store.path / KEY / f"{version}.meta.json").unlink()


def overwrite(store: ModelStore, version: int, blob: bytes) -> None:
    if isinstance(store, RedisModelStore):
        store.client.set(blob_at(store, version), blob)
    else:
        Path(blob_at(store, version)).write_bytes(blob)


def test_healthy_blobs_give_no_error(store: ModelStore) -> None:
    records = saved(store)
    assert store.check_blobs(KEY, records) == []
    assert store.check_blobs(KEY, records, read=True) == []
    assert store.check_blobs(KEY, []) == []


def test_a_missing_blob_is_named_with_where_it_was(store: ModelStore) -> None:
    records = saved(store)
    remove(store, 2)
    for read in (False, True):
        errors = store.check_blobs(KEY, records, read=read)
        assert [(e.model_key, e.version, e.problem, e.where) for e in errors] == [
            (KEY, 2, MISSING_BLOB, blob_at(store, 2))]
        assert str(errors[0]) == f"model 'gCTF:gpu' version 2: {MISSING_BLOB} ({blob_at(store, 2)})"


def test_a_version_trimmed_meanwhile_is_no_error(store: ModelStore) -> None:
    records = saved(store)
    remove(store, 1, meta_too=True)  # the record read before the trim, checked after it
    assert store.check_blobs(KEY, records) == []
    assert store.check_blobs(KEY, records, read=True) == []


def test_a_changed_blob_is_found_only_when_read(store: ModelStore) -> None:
    records = saved(store)
    overwrite(store, 3, b"blob-X")  # the same length, other bytes
    assert store.check_blobs(KEY, records) == []  # the cheap look reads no blob
    errors = store.check_blobs(KEY, records, read=True)
    assert [e.version for e in errors] == [3]
    assert errors[0].problem.startswith("its blob has sha256 ") and errors[0].problem.endswith(
        f", not the recorded {records[2].sha256[:12]}...: changed or truncated")
    assert errors[0].where == blob_at(store, 3)


@pytest.mark.parametrize("store", ["redis"], indirect=True)  # a Redis key's type
def test_a_redis_blob_key_of_another_type_is_named(store: RedisModelStore) -> None:
    records = saved(store)
    store.client.delete(blob_at(store, 1))
    store.client.hset(blob_at(store, 1), "x", "1")
    for read in (False, True):
        errors = store.check_blobs(KEY, records, read=read)
        assert [(e.version, e.problem) for e in errors] == [(1, "its blob is a Redis hash, not a string")]


@pytest.mark.parametrize("store", ["directory"], indirect=True)  # a file name the record would choose
def test_a_directory_record_naming_another_format_is_named_and_no_file_is_opened(store: DirectoryModelStore) -> None:
    records = saved(store)
    odd = dataclasses.replace(records[0], format="../../x")
    errors = store.check_blobs(KEY, [odd], read=True)
    assert [(e.version, e.problem) for e in errors] == [
        (1, "its record names blob format '../../x', not one of ('ubj', 'json')")]


@pytest.mark.parametrize("store", ["directory"], indirect=True)  # a file's own read error
def test_a_blob_that_cannot_be_read_is_named_and_the_others_are_still_checked(store: DirectoryModelStore) -> None:
    records = saved(store)
    blob = Path(blob_at(store, 1))
    blob.unlink()
    blob.symlink_to(blob.name)  # a link to itself: reading it fails with ELOOP, not "no such file"
    Path(blob_at(store, 3)).write_bytes(b"changed")
    errors = store.check_blobs(KEY, records, read=True)
    assert [e.version for e in errors] == [1, 3]
    assert errors[0].problem == "its blob cannot be read: Too many levels of symbolic links"
    assert errors[1].problem.startswith("its blob has sha256 ")  # checked after the one that could not be read
    assert errors[0].where == str(blob)
