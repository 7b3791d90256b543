"""An operator's rollback on the real directory store: which version it goes back to, what it refuses, and the
new version it saves (the old blob, verified, above every version given and announced)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.model.errors import ModelNotFoundError, RegistryError
from app.registry.base import sha256_hex
from app.registry.directory import DirectoryModelStore
from app.trainer.registry import ModelRegistry
from app.trainer.rollback import plan_rollback, roll_back

KEY = "gCTF:gpu"


def promote(store: DirectoryModelStore, blob: bytes, key: str = KEY) -> int:
    record = store.save(key, blob, fmt="json", features=["a"], params={"max_depth": 3}, metrics={"rmse_ms": 1.0},
                        n_samples=10, training_window=(1.0, 2.0))
    return store.promote(key, record.version).version


@pytest.fixture
def store(tmp_path: Path) -> DirectoryModelStore:
    return DirectoryModelStore(tmp_path / "models", keep=5)


def test_rollback_saves_the_previous_model_again_above_every_version_given_and_announced(
        store: DirectoryModelStore) -> None:
    for blob in (b"one", b"two", b"three"):
        promote(store, blob)
    plan = plan_rollback(store, KEY, announced=7)  # model-updates went further than this registry (it lost data)
    assert (plan.current.version, plan.target.version) == (3, 2)
    fields = roll_back(ModelRegistry(store=store), plan)
    assert fields["version"] == 8 and fields["sha256"] == sha256_hex(b"two")
    blob, record = store.load(KEY)
    assert (blob, record.version, record.restores) == (b"two", 8, 2)
    assert (record.params, record.metrics, record.training_window) == ({"max_depth": 3}, {"rmse_ms": 1.0}, (1.0, 2.0))
    assert "restores" not in fields  # model-updates keeps its contract

    # a second rollback goes further back (v1), not back to v3, the model rolled back from
    again = plan_rollback(store, KEY)
    assert (again.current.version, again.target.version) == (8, 1)
    fields = roll_back(ModelRegistry(store=store), again)
    assert (fields["version"], store.load(KEY)[1].restores) == (9, 1)
    # ... and going back to a rollback is going back to the model it restores
    third = plan_rollback(store, KEY, to_version=8)
    assert roll_back(ModelRegistry(store=store), third)["sha256"] == sha256_hex(b"two")
    assert store.load(KEY)[1].restores == 2


def test_a_rollback_refuses_what_it_cannot_do(store: DirectoryModelStore) -> None:
    with pytest.raises(ModelNotFoundError, match="no model 'gCTF:gpu' in the registry"):
        plan_rollback(store, KEY)
    promote(store, b"one")
    with pytest.raises(ModelNotFoundError, match="has no version older than 1"):
        plan_rollback(store, KEY)
    promote(store, b"two")
    with pytest.raises(ModelNotFoundError, match=r"has no version 5 \(kept: v1, v2\)"):
        plan_rollback(store, KEY, to_version=5)
    with pytest.raises(RegistryError, match="v2 is the current version already"):
        plan_rollback(store, KEY, to_version=2)
    with pytest.raises(RegistryError, match="must match"):
        plan_rollback(store, "../etc")
    promote(store, b"one")  # v3: the model of v1 again, trained anew
    with pytest.raises(RegistryError, match="is the model the current v3 serves already"):
        plan_rollback(store, KEY, to_version=1)
    assert plan_rollback(store, KEY).target.version == 2  # the newest with another blob

    plan = plan_rollback(store, KEY)
    promote(store, b"four")  # the trainer promoted meanwhile: nothing done
    with pytest.raises(RegistryError, match="^the current version of gCTF:gpu changed to v4 while rolling back: "
                                            "nothing changed; run it again$"):
        roll_back(ModelRegistry(store=store), plan)
    assert store.current(KEY).version == 4  # type: ignore[union-attr]
    assert [r.version for r in store.versions(KEY)] == [1, 2, 3, 4]  # nothing saved
