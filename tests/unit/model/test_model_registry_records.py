"""A record the registry cannot read is a RegistryError naming the key, the version and what is wrong (one line);
the directory store reads the others, loads its current model past it and changes nothing for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.model.errors import ModelNotFoundError, RegistryError, RegistryUnavailableError
from app.registry.base import CorruptRecordError, ModelRecord, read_record
from app.registry.directory import DirectoryModelStore
from app.trainer.rollback import plan_rollback

KEY = "gCTF:gpu"
GOOD = ModelRecord(KEY, 2, "ab" * 32, "ubj", ("a__mean",), {"max_depth": 3}, {"rmse_ms": 1.5}, 10, (1.0, 2.0), 5.0,
                   "/m/2.ubj", None)


@pytest.mark.parametrize(("raw", "problem"), [
    (b"not json{", "metadata is not JSON (Expecting value: line 1 column 1 (char 0))"),
    (b'{"model_key": "gCTF:gpu"}',
     "metadata lacks 'version', 'sha256', 'format', 'features', 'created_ts', 'location'"),
    (b"[1, 2]", "metadata is a JSON array, not an object"),
    (b"null", "metadata is a JSON null, not an object"),
    (b"\xff\xfe", "metadata is not JSON ("),
    (GOOD.to_json().replace(b'"version": 2', b'"version": "two"'),
     "metadata field 'version' is unusable (ValueError: invalid literal for int() with base 10: 'two')"),
    (GOOD.to_json().replace(b'"features": ["a__mean"]', b'"features": null'),
     "metadata field 'features' is unusable (TypeError: 'NoneType' object is not iterable)"),
    (GOOD.to_json().replace(b'"training_window": [1.0, 2.0]', b'"training_window": [1.0]'),
     "metadata field 'training_window' is unusable (IndexError: list index out of range)"),
    (GOOD.to_json().replace(b'"metrics": {"rmse_ms": 1.5}', b'"metrics": [1]'),
     "metadata field 'metrics' is unusable (AttributeError: 'list' object has no attribute 'items')"),
], ids=["not-json", "no-fields", "array", "null", "not-utf8", "version", "features", "window", "metrics"])
def test_an_unreadable_record_says_which_and_what_is_wrong_in_one_line(raw: bytes, problem: str) -> None:
    with pytest.raises(ValueError) as parsing:
        ModelRecord.from_json(raw)
    assert str(parsing.value).startswith(problem) and "\n" not in str(parsing.value)

    with pytest.raises(CorruptRecordError) as reading:
        read_record(raw, KEY, 2, "rttsched:model:gCTF:gpu:meta:2")
    exc = reading.value
    assert isinstance(exc, RegistryError) and not isinstance(exc, RegistryUnavailableError)
    assert (exc.model_key, exc.version, exc.where) == (KEY, 2, "rttsched:model:gCTF:gpu:meta:2")
    assert str(exc).startswith(f"model 'gCTF:gpu' version 2: {problem}")
    assert str(exc).endswith(" (rttsched:model:gCTF:gpu:meta:2)") and "\n" not in str(exc)


def test_a_healthy_record_reads_as_before() -> None:
    assert ModelRecord.from_json(GOOD.to_json()) == GOOD == read_record(GOOD.to_json(), KEY, 2)
    legacy = {k: v for k, v in GOOD.to_dict().items() if k not in ("params", "metrics", "n_samples", "restores",
                                                                     "training_window")}
    assert ModelRecord.from_dict(legacy) == ModelRecord(KEY, 2, GOOD.sha256, "ubj", ("a__mean",), {}, {}, 0, None,
                                                        5.0, "/m/2.ubj", None)


def save(store: DirectoryModelStore, blob: bytes, key: str = KEY) -> int:
    record = store.save(key, blob, fmt="json", features=["a"], params={}, metrics={}, n_samples=1)
    return store.promote(key, record.version).version


@pytest.fixture
def store(tmp_path: Path) -> DirectoryModelStore:
    return DirectoryModelStore(tmp_path / "models", keep=5)


def test_the_directory_store_names_an_unreadable_record_and_reads_past_it(store: DirectoryModelStore) -> None:
    for blob in (b"one", b"two", b"three"):
        save(store, blob)
    meta = store.path / KEY / "2.meta.json"
    meta.write_bytes(b"{bad\n")
    said = f"model 'gCTF:gpu' version 2: metadata is not JSON (Expecting property name enclosed in double quotes: " \
           f"line 1 column 2 (char 1)) ({meta})"

    assert store.load(KEY)[0] == b"three"  # the current model loads (the trainer's champion, a worker's model)
    assert store.load(KEY, 1)[0] == b"one"
    assert store.current(KEY).version == 3  # type: ignore[union-attr]
    records, unreadable = store.readable_versions(KEY)
    assert [r.version for r in records] == [1, 3] and [str(e) for e in unreadable] == [said]
    with pytest.raises(CorruptRecordError, match="^" + said.replace("(", r"\(").replace(")", r"\)") + "$"):
        store.versions(KEY)
    with pytest.raises(CorruptRecordError, match="version 2: metadata is not JSON"):
        store.load(KEY, 2)
    with pytest.raises(CorruptRecordError, match="version 2: metadata is not JSON"):
        store.promote(KEY, 2)
    assert store.current(KEY).version == 3 and meta.read_bytes() == b"{bad\n"  # type: ignore[union-attr]

    # a rollback: refused where it needs that record, going ahead where it does not
    with pytest.raises(RegistryError, match=r"version 2: metadata is not JSON .*: cannot tell whether a rollback "
                                            r"goes back to it; name the version to go back to \(--to\)$"):
        plan_rollback(store, KEY)
    with pytest.raises(CorruptRecordError, match="version 2: metadata is not JSON"):
        plan_rollback(store, KEY, to_version=2)
    assert plan_rollback(store, KEY, to_version=1).target.version == 1

    # the current record unreadable: an error of the registry's, not a missing model, from what reads it
    (store.path / KEY / "3.meta.json").write_bytes(b'{"model_key": "gCTF:gpu"}')
    for read in (store.current, store.load):
        with pytest.raises(CorruptRecordError, match="version 3: metadata lacks 'version'") as exc:
            read(KEY)
        assert not isinstance(exc.value, (ModelNotFoundError, RegistryUnavailableError))
    with pytest.raises(CorruptRecordError, match="version 3: metadata lacks 'version'"):
        plan_rollback(store, KEY, to_version=1)


class _Keys:
    """A store with many keys and none of them the one asked for."""

    def __init__(self, n: int) -> None:
        self._keys = [f"app{i:05d}:gpu" for i in range(n)]

    def current(self, model_key: str) -> None:
        return None

    def keys(self) -> list[str]:
        return self._keys


def test_a_rollback_of_an_unknown_key_says_how_many_keys_it_does_not_list() -> None:
    with pytest.raises(ModelNotFoundError) as exc:
        plan_rollback(_Keys(3001), KEY)  # type: ignore[arg-type]
    assert str(exc.value) == ("no model 'gCTF:gpu' in the registry (keys: "
                              + ", ".join(f"app{i:05d}:gpu" for i in range(10)) + " and 2991 more)")
    with pytest.raises(ModelNotFoundError, match=r"\(keys: app00000:gpu, app00001:gpu\)$"):
        plan_rollback(_Keys(2), KEY)  # type: ignore[arg-type]
