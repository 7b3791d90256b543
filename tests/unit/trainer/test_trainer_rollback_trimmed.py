"""A rollback without ``--to`` on a registry whose older versions were trimmed (``keep``), on the real directory
store: it goes back along the lineage of the models served — a kept rollback copy stands for the version whose
model it is — never to a copy of the current model, and as before where nothing it needs was trimmed."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.model.errors import ModelNotFoundError, RegistryError
from app.registry.base import sha256_hex
from app.registry.directory import DirectoryModelStore
from app.trainer.registry import ModelRegistry
from app.trainer.rollback import plan_rollback, roll_back

KEY = "rb:cpu"


def promote(store: DirectoryModelStore, blob: bytes) -> int:
    current = store.current(KEY)
    return store.save(KEY, blob, fmt="json", features=["x"], params={}, metrics={}, n_samples=100,
                      replacing=current.version if current is not None else 0).version


def back(store: DirectoryModelStore, to_version: int | None = None) -> tuple[int, int, int | None]:
    """Roll ``KEY`` back the CLI's way: (the version gone back to, the new current version, the version whose model
    it is)."""
    plan = plan_rollback(store, KEY, to_version)
    fields = roll_back(ModelRegistry(store=store), plan)
    current = store.current(KEY)
    assert current is not None and current.version == fields["version"]
    return plan.target.version, current.version, current.restores


def kept(store: DirectoryModelStore) -> list[tuple[int, int | None]]:
    return [(r.version, r.restores) for r in store.versions(KEY)]


def test_a_second_rollback_goes_further_back_to_a_kept_copy_of_a_trimmed_version(tmp_path: Path) -> None:
    """The reviewer's sequence (RTT_MODEL_KEEP=2): v1 A, v2 B; rollback -> v3 (=v1); --to 2 -> v4 (=v2), v1 and v2
    trimmed; a rollback goes back to A, kept as v3, not "no version older than 2"."""
    store = DirectoryModelStore(tmp_path / "models", keep=2)
    assert (promote(store, b"model-A"), promote(store, b"model-B")) == (1, 2)
    assert back(store) == (1, 3, 1)
    assert back(store, to_version=2) == (2, 4, 2)
    assert kept(store) == [(3, 1), (4, 2)]

    assert back(store) == (3, 5, 1)  # v3 holds the model of v1, the one served before v2's
    blob, record = store.load(KEY)
    assert blob == b"model-A" and record.sha256 == sha256_hex(b"model-A") and record.restores == 1
    # and from the model of v1 there is nothing further back: not back to B (v4), the model rolled back from
    with pytest.raises(ModelNotFoundError, match="has no version older than 1"):
        plan_rollback(store, KEY)


def test_the_rollback_never_goes_to_a_copy_of_the_current_model(tmp_path: Path) -> None:
    """keep=3: v1 A, v2 B; back to v1 (v3 = A), to v2 (v4 = B), to v3 (v5 = A): v1 and v2 trimmed. From A there is
    nothing further back — neither v3 (A again) nor v4 (B, rolled back from) is gone back to; --to 4 (v6 = B),
    and from B the rollback goes to A (v5), not to v4 (B again)."""
    store = DirectoryModelStore(tmp_path / "models", keep=3)
    promote(store, b"model-A")
    promote(store, b"model-B")
    assert back(store) == (1, 3, 1)
    assert back(store, to_version=2) == (2, 4, 2)
    assert back(store, to_version=3) == (3, 5, 1)
    assert kept(store) == [(3, 1), (4, 2), (5, 1)]
    with pytest.raises(ModelNotFoundError, match="has no version older than 1"):
        plan_rollback(store, KEY)
    assert back(store, to_version=4) == (4, 6, 2)
    assert kept(store) == [(4, 2), (5, 1), (6, 2)]
    assert back(store) == (5, 7, 1)
    assert store.load(KEY)[0] == b"model-A"


def test_the_newest_model_kept_from_before_the_served_one_is_gone_back_to(tmp_path: Path) -> None:
    """keep=3: v1 A, v2 B, v3 C; back to v1 (v4 = A), then to v3 (v5 = C), which trims v1 and v2. From C (the
    model of v3) the version before it, v2, is gone with its model; the newest model before C that is kept is
    v1's, held by v4 — not "no version older than 3" (v3 is C itself)."""
    store = DirectoryModelStore(tmp_path / "models", keep=3)
    for blob in (b"A", b"B", b"C"):
        promote(store, blob)
    assert back(store, to_version=1) == (1, 4, 1)
    assert back(store, to_version=3) == (3, 5, 3)
    assert kept(store) == [(3, None), (4, 1), (5, 3)]
    assert back(store) == (4, 6, 1)
    assert store.load(KEY)[0] == b"A"


def test_untrimmed_rollbacks_go_where_they_went(tmp_path: Path) -> None:
    """Nothing trimmed: by version number before the model served, a rollback copy at its own place when a
    trained model follows it."""
    store = DirectoryModelStore(tmp_path / "models", keep=10)
    for blob in (b"A", b"B", b"C"):
        promote(store, blob)
    assert back(store, to_version=1) == (1, 4, 1)
    promote(store, b"D")  # v5, a retrain after the rollback to A
    assert back(store) == (4, 6, 1)  # the version before v5: v4, A
    with pytest.raises(ModelNotFoundError, match="has no version older than 1"):
        plan_rollback(store, KEY)
    assert back(store, to_version=3) == (3, 7, 3)
    assert back(store) == (2, 8, 2)
    assert back(store) == (1, 9, 1)


def test_an_unreadable_version_that_may_be_a_copy_of_the_model_meant_is_named(tmp_path: Path) -> None:
    """keep=2 as in the reviewer's sequence, then v3 (= v1, the version a rollback would go back to) unreadable: v4
    is the only readable version, so the rollback cannot tell whether v3 holds an older model — it names v3
    instead of saying there is none."""
    store = DirectoryModelStore(tmp_path / "models", keep=2)
    promote(store, b"model-A")
    promote(store, b"model-B")
    back(store)
    back(store, to_version=2)
    (store.path / KEY / "3.meta.json").write_bytes(b"{bad\n")
    with pytest.raises(RegistryError, match=r"^model 'rb:cpu' version 3: metadata is not JSON .*: cannot tell "
                                            r"whether a rollback goes back to it; name the version to go back to "
                                            r"\(--to\)$"):
        plan_rollback(store, KEY)
