"""A current version whose blob or metadata is gone from the registry (Redis evicted it, an operator deleted it, a
file of the models directory was removed): the trainer's challenger replaces it, with one save, on both stores."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.model.errors import CurrentChangedError
from app.registry.base import ModelStore
from app.registry.directory import DirectoryModelStore
from app.registry.redis_store import RedisModelStore
from app.trainer.history import Dataset
from app.trainer.pipeline import retrain, train_challenger
from app.trainer.registry import PROMOTE_TRIES, ModelRegistry

pytestmark = pytest.mark.integration

KEY = "gCTF:cpu"
FAST = {"n_estimators": 20}
SAVES_ALLOWED = 50  # a registry that saves more often than this for one challenger is spinning


class TooManySaves(AssertionError):
    """Raised by a counting store past :data:`SAVES_ALLOWED`: a spinning promotion ends in the test's time."""


def dataset(n: int = 200, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 100, n)
    X = np.column_stack([x, rng.normal(size=n)]).astype(np.float32)
    return Dataset(X, 100.0 + 4.0 * x, np.arange(n, dtype=np.float64), ("util__mean", "junk__mean"))


@pytest.fixture(params=["directory", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ModelStore]:
    if request.param == "directory":
        yield DirectoryModelStore(tmp_path / "models")
        return
    s = RedisModelStore(request.getfixturevalue("redis_url"), namespace=f"t{uuid.uuid4().hex[:10]}")
    yield s
    s.close()


def count_saves(store: ModelStore, refuse: bool = False) -> list[int]:
    """Count ``store``'s saves (the list's length); past :data:`SAVES_ALLOWED` one raises :class:`TooManySaves`.
    ``refuse``: every save is refused as if another writer had just promoted."""
    calls: list[int] = []
    save = store.save

    def counted(model_key: str, blob: bytes, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) > SAVES_ALLOWED:
            raise TooManySaves(f"{len(calls)} saves of one challenger")
        if refuse:
            raise CurrentChangedError(model_key, kw.get("replacing") or 0, 1000 + len(calls))
        return save(model_key, blob, **kw)

    store.save = counted  # type: ignore[method-assign]
    return calls


def remove(store: ModelStore, version: int, part: str) -> None:
    """Delete the blob or the metadata of ``version`` behind the store's back."""
    if isinstance(store, DirectoryModelStore):
        name = f"{version}.ubj" if part == "blob" else f"{version}.meta.json"
        (store.path / KEY / name).unlink()
    else:
        assert isinstance(store, RedisModelStore)
        assert store.client.delete(f"{store.namespace}:model:{KEY}:{part}:{version}") == 1


@pytest.mark.parametrize("part", ["blob", "meta"])
def test_a_current_version_whose_blob_or_metadata_is_gone_is_replaced_by_the_challenger(
        store: ModelStore, part: str) -> None:
    registry = ModelRegistry(store=store)
    first = registry.register(KEY, train_challenger(dataset(), "cpu", params=FAST, selector=None), replacing=0)
    assert first["version"] == 1
    remove(store, 1, part)
    saves = count_saves(store)

    challenger, verdict = retrain(dataset(seed=1), "cpu", lambda ho: registry.champion_metrics(KEY, ho),
                                  params=FAST, selector=None)
    assert verdict.promote
    verdict = registry.judge_again(KEY, challenger, verdict)  # the service asks before it registers
    final, fields = registry.promote_challenger(KEY, challenger, verdict)
    assert len(saves) == 1 and fields is not None and fields["version"] == 2  # one save, a version never used
    assert final.reason == "champion_unusable"  # the version the pointer names counts, unusable: it is replaced
    current = store.current(KEY)
    assert current is not None and current.version == 2 and current.sha256 == fields["sha256"]


def test_a_challenger_refused_again_and_again_gives_up(store: ModelStore, caplog: pytest.LogCaptureFixture) -> None:
    """Every compare-and-set refused (the current version keeps changing under it): the challenger gives up after
    :data:`PROMOTE_TRIES` saves with a WARNING, rather than trying for ever."""
    registry = ModelRegistry(store=store)
    challenger, verdict = retrain(dataset(), "cpu", lambda ho: registry.champion_metrics(KEY, ho), params=FAST,
                                  selector=None)
    saves = count_saves(store, refuse=True)
    with pytest.raises(CurrentChangedError):
        registry.promote_challenger(KEY, challenger, verdict)
    assert len(saves) == PROMOTE_TRIES
    assert any("gave up" in r.getMessage() for r in caplog.records)
