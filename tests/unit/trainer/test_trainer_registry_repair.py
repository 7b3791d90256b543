"""The trainer's registry check and registration on the real directory store, where a registry goes wrong.

* one key's unreadable record does not stop the check of the other keys: named once, counted in
  ``rtt_trainer_degraded{reason="registry_unreadable"}``; the registry unavailable still ends the check;
* a current version whose blob is gone (its metadata kept) is a lost model: replaced, found with a cheap look;
* a save applied whose answer was lost is the challenger's own promotion, not another writer's;
* a retrain cancelled while it waits for the registry (the trainer stopping) does not say the registry is back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from trainer_samples import KEY, Producer, samples, trainer

from app.config import Settings
from app.model.errors import RegistryUnavailableError
from app.registry.base import ModelRecord
from app.registry.directory import DirectoryModelStore
from app.registry.store import load_predictor
from app.trainer.agreement import REGISTRY_LOST, UNREADABLE
from app.trainer.service import Outcome, TrainerService

FAST = {"n_estimators": 30}
A, Z = "appa:cpu", "zzz:cpu"  # checked in this order


class Store(DirectoryModelStore):
    """A :class:`DirectoryModelStore` a test changes: ``loads`` counts the blobs loaded, ``on_save`` replaces the
    save (given the real one), ``away`` makes it raise the registry unavailable; ``inner`` is the same directory,
    unchanged."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.inner = DirectoryModelStore(root)
        self.loads = 0
        self.on_save: Any = None
        self.away = False

    def _here(self) -> None:
        if self.away:
            raise RegistryUnavailableError("model registry at test unavailable: ConnectionError: gone")

    def load(self, model_key: str, version: int | None = None) -> tuple[bytes, ModelRecord]:
        self._here()
        self.loads += 1
        return super().load(model_key, version)

    def current(self, model_key: str) -> ModelRecord | None:
        self._here()
        return super().current(model_key)

    def keys(self) -> list[str]:
        self._here()
        return super().keys()

    def check_writable(self, model_key: str, nbytes: int = 1) -> None:
        self._here()
        super().check_writable(model_key, nbytes)

    def save(self, model_key: str, blob: bytes, **kw: Any) -> ModelRecord:  # type: ignore[override]
        if self.on_save is not None:
            return self.on_save(super().save, model_key, blob, **kw)  # type: ignore[no-any-return]
        self._here()
        return super().save(model_key, blob, **kw)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "models")


@pytest.fixture
def service(tmp_path: Path, store: Store) -> TrainerService:
    """A trainer on ``store`` with 700 samples of :data:`KEY`, Kafka that answers at once."""
    settings = Settings.from_env({}, models_dir=str(tmp_path / "models"), retry_max_backoff_s=0.05)
    return trainer(settings, store, FAST)


def value(service: TrainerService, name: str, labels: dict[str, str] | None = None) -> float:
    return service.metrics.registry.get_sample_value(name, labels or {}) or 0.0


def put(store: Store, key: str, blob: bytes = b"model") -> ModelRecord:
    """``blob`` saved as ``key``'s next version and made current."""
    current = store.inner.current(key)
    return store.inner.save(key, blob, fmt="json", features=["a"], params={}, metrics={}, n_samples=1,
                            replacing=current.version if current is not None else 0)


def announce(service: TrainerService, record: ModelRecord) -> None:
    service._note_announced({"model_key": record.model_key, "version": record.version, "sha256": record.sha256})


def checks(service: TrainerService, n: int = 1) -> list[list[str]]:
    """``n`` registry checks (what each acted on); the retrains they start are only noted, in ``service.started``."""
    started: list[dict[str, Any]] = []
    service.started = started  # type: ignore[attr-defined]

    def submit(event: dict[str, Any], mark: Any = None) -> Any:
        started.append(event)
        return object()

    service.submit = submit  # type: ignore[method-assign]

    async def go() -> list[list[str]]:
        return [await service.check_registry() for _ in range(n)]

    return asyncio.run(go())


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# -- one key's unreadable record


def test_an_unreadable_record_does_not_stop_the_repair_of_the_keys_after_it(
        service: TrainerService, store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """appa:cpu's current metadata is not JSON, zzz:cpu lost its current pointer: each check starts zzz:cpu's
    replacement; appa:cpu is named once across three checks and counted, until it is repaired."""
    caplog.set_level(logging.INFO)
    a, z = put(store, A), put(store, Z)
    announce(service, a)
    announce(service, z)
    meta = tmp_path / "models" / A / "1.meta.json"
    good = meta.read_bytes()
    meta.write_bytes(b'{"garbage')
    (tmp_path / "models" / Z / "CURRENT").unlink()
    assert value(service, "rtt_trainer_degraded", {"reason": UNREADABLE}) == 0.0

    assert checks(service, 3) == [[Z], [Z], [Z]]
    assert [(e["model_key"], e["reason"]) for e in service.started] == [(Z, REGISTRY_LOST)] * 3  # type: ignore[attr-defined]
    said = [m for m in warnings(caplog) if A in m]
    assert len(said) == 1, said
    assert said[0].startswith(f"registry check: model {A} cannot be checked, skipped until it can: model '{A}' "
                              "version 1: metadata is not JSON")
    assert str(meta) in said[0]
    assert not [m for m in warnings(caplog) if "registry check failed" in m]
    assert value(service, "rtt_trainer_degraded", {"reason": UNREADABLE}) == 1.0

    meta.write_bytes(good)  # repaired
    caplog.clear()
    checks(service)
    assert f"registry check: model {A} can be checked again" in [r.getMessage() for r in caplog.records]
    assert value(service, "rtt_trainer_degraded", {"reason": UNREADABLE}) == 0.0


def test_a_changed_problem_is_named_again(service: TrainerService, store: Store, tmp_path: Path,
                                          caplog: pytest.LogCaptureFixture) -> None:
    announce(service, put(store, A))
    meta = tmp_path / "models" / A / "1.meta.json"
    meta.write_bytes(b'{"garbage')
    checks(service, 2)
    meta.write_bytes(b"[]")
    checks(service, 2)
    said = [m for m in warnings(caplog) if A in m]
    assert len(said) == 2 and "not JSON" in said[0] and "JSON array" in said[1], said


def test_the_registry_unavailable_still_ends_the_check(service: TrainerService, store: Store,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """Redis away: the check ends at the first key, without a line per key (one for the registry)."""
    for key in (A, Z):
        announce(service, put(store, key))
    store.away = True
    with pytest.raises(RegistryUnavailableError):
        checks(service)
    assert warnings(caplog) == ["registry check: model registry at test unavailable: ConnectionError: gone; degraded"
                                " (model_store) until a check reaches it"]
    assert value(service, "rtt_trainer_degraded", {"reason": UNREADABLE}) == 0.0


# -- a current version whose blob is gone


def test_a_current_version_whose_blob_is_gone_is_replaced(service: TrainerService, store: Store, tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """v1 trained, announced; its blob deleted: the next check finds it (no blob loaded while it was there) and
    replaces it by a model trained from the history, v2, which loads."""
    producer = service._producer
    assert isinstance(producer, Producer)

    async def retrain() -> Outcome:
        return await service.retrain({"model_key": KEY, "reason": "cold_start", "ts": time.time(), "onset_ts": None})

    assert asyncio.run(retrain()).outcome == "promoted"
    v1 = store.inner.current(KEY)
    assert v1 is not None
    announce(service, v1)
    loads = store.loads
    assert checks(service, 3) == [[], [], []]
    assert store.loads == loads, "a blob was loaded though it was there"

    (tmp_path / "models" / KEY / "1.ubj").unlink()
    assert checks(service) == [[KEY]]
    assert [(e["model_key"], e["reason"]) for e in service.started] == [(KEY, REGISTRY_LOST)]  # type: ignore[attr-defined]
    assert [m for m in warnings(caplog) if "has its metadata but its blob is gone" in m and KEY in m]

    outcome = asyncio.run(service.retrain(service.started[0]))  # type: ignore[attr-defined]
    service._executor.shutdown(wait=True)
    assert (outcome.reason, outcome.outcome, outcome.version) == (REGISTRY_LOST, "promoted", 2), outcome
    predictor, record = load_predictor(store.inner, KEY)
    assert record.version == 2 and [u["version"] for u in producer.sent] == [1, 2]


def test_a_current_version_whose_blob_is_there_is_left_alone_whatever_its_location_says(
        service: TrainerService, store: Store, tmp_path: Path) -> None:
    """The models directory moved since the save (the record's location names the old path): the cheap look is
    the store's own (its directory, not the location), finds the blob, and nothing is loaded or replaced."""
    record = put(store, A)
    announce(service, record)
    meta = tmp_path / "models" / A / "1.meta.json"
    meta.write_bytes(meta.read_bytes().replace(str(tmp_path).encode(), b"/elsewhere"))
    assert checks(service, 2) == [[], []]
    assert store.loads == 0


def test_a_current_version_never_announced_whose_blob_is_gone_is_not_announced(
        service: TrainerService, store: Store, tmp_path: Path) -> None:
    record = put(store, A)
    (tmp_path / "models" / A / "1.json").unlink()
    assert checks(service, 2) == [[A], [A]]
    assert service._producer.sent == []  # type: ignore[union-attr]
    assert record.version == 1


# -- a save applied whose answer was lost


def retrain(service: TrainerService) -> Outcome:
    async def go() -> Outcome:
        return await service.retrain({"model_key": KEY, "reason": "drift", "ts": time.time() - 5.0,
                                      "onset_ts": time.time() - 10.0})

    try:
        return asyncio.run(go())
    finally:
        service._executor.shutdown(wait=True)


def test_a_save_applied_whose_answer_was_lost_is_the_challenger_s_own_promotion(
        service: TrainerService, store: Store, caplog: pytest.LogCaptureFixture) -> None:
    """The save is applied, its answer lost, and the retry (as Redis's compare-and-set retries it) finds the
    current version changed — to the challenger: promoted as v1, announced at once, counted as promoted."""
    tries: list[int] = []

    def applied_then_retried(save: Any, model_key: str, blob: bytes, **kw: Any) -> ModelRecord:
        tries.append(save(model_key, blob, **kw).version)  # applied; the reply lost: tried again
        return save(model_key, blob, **kw)  # type: ignore[no-any-return]

    store.on_save = applied_then_retried
    outcome = retrain(service)

    assert tries == [1]
    assert (outcome.outcome, outcome.version) == ("promoted", 1), outcome
    assert [r.version for r in store.inner.versions(KEY)] == [1]
    assert [u["version"] for u in service._producer.sent] == [1]  # type: ignore[union-attr]
    assert value(service, "rtt_trainer_retrains_total", {"reason": "drift", "outcome": "promoted"}) == 1.0
    assert value(service, "rtt_trainer_retrains_total", {"reason": "drift", "outcome": "rejected"}) == 0.0
    assert value(service, "rtt_trainer_drift_to_promotion_seconds_count") == 1.0
    assert not [m for m in warnings(caplog) if "judging it again" in m or "rejected" in m]
    assert [m for m in warnings(caplog) if "the challenger is current already, as v1" in m]


def test_a_save_applied_whose_answer_never_came_is_announced_by_the_retrain_that_tries_again(
        service: TrainerService, store: Store) -> None:
    """The save is applied and the registry then does not answer (Redis away for the retries too): the retrain
    waits for it, finds its challenger current, and announces it — not a second model judged against the first."""
    def applied_then_away(save: Any, model_key: str, blob: bytes, **kw: Any) -> ModelRecord:
        store.on_save = None
        save(model_key, blob, **kw)
        raise RegistryUnavailableError("model registry at test unavailable: ConnectionError: reply lost")

    store.on_save = applied_then_away
    outcome = retrain(service)

    assert (outcome.outcome, outcome.version) == ("promoted", 1), outcome
    assert outcome.verdict is not None and outcome.verdict.promote
    assert [r.version for r in store.inner.versions(KEY)] == [1]
    assert [u["version"] for u in service._producer.sent] == [1]  # type: ignore[union-attr]
    assert value(service, "rtt_trainer_retrains_total", {"reason": "drift", "outcome": "promoted"}) == 1.0
    assert value(service, "rtt_trainer_drift_to_promotion_seconds_count") == 1.0
    assert value(service, "rtt_trainer_training_seconds_count") == 1.0  # not trained again
    assert value(service, "rtt_trainer_degraded", {"reason": "model_store"}) == 0.0


def test_a_save_that_was_not_applied_is_trained_and_saved_again(service: TrainerService, store: Store) -> None:
    def away_once(save: Any, model_key: str, blob: bytes, **kw: Any) -> ModelRecord:
        store.on_save = None
        raise RegistryUnavailableError("model registry at test unavailable: ConnectionError: refused")

    store.on_save = away_once
    outcome = retrain(service)
    assert (outcome.outcome, outcome.version) == ("promoted", 1), outcome
    assert value(service, "rtt_trainer_training_seconds_count") == 2.0
    assert [u["version"] for u in service._producer.sent] == [1]  # type: ignore[union-attr]


# -- the trainer stopping while a retrain waits for the registry


def test_a_retrain_cancelled_while_it_waits_for_the_registry_does_not_say_it_is_back(
        service: TrainerService, store: Store, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)

    def away(save: Any, model_key: str, blob: bytes, **kw: Any) -> ModelRecord:
        store.away = True
        raise RegistryUnavailableError("model registry at test unavailable: ConnectionError: refused")

    store.on_save = away

    async def go() -> None:
        task = service.submit({"model_key": KEY, "reason": "drift", "ts": time.time(), "onset_ts": None})
        assert task is not None
        deadline = time.monotonic() + 60
        while value(service, "rtt_trainer_degraded", {"reason": "model_store"}) != 1.0:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(go())
    service._executor.shutdown(wait=True)
    assert value(service, "rtt_trainer_degraded", {"reason": "model_store"}) == 1.0
    assert not [r for r in caplog.records if "usable again" in r.getMessage()]
    assert not service.outcomes


def test_a_retrain_over_an_unreadable_current_record_fails_before_its_training(
        service: TrainerService, store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """It used to train in full, score the champion as unusable, then fail in the registry with a traceback: now one
    ERROR line naming the record, nothing trained, nothing saved."""
    record = put(store, KEY)
    (tmp_path / "models" / KEY / f"{record.version}.meta.json").write_bytes(b"{bad\n")
    with caplog.at_level(logging.INFO, logger="app.trainer"):
        outcome = retrain(service)
    assert outcome.outcome == "failed" and outcome.detail.startswith("CorruptRecordError: ")
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.exc_info for r in errors] == [None]
    assert errors[0].getMessage().startswith(f"retrain of {KEY} failed: the registry's record cannot be read, "
                                             f"nothing trained: model '{KEY}' version 1: metadata is not JSON")
    assert value(service, "rtt_trainer_training_seconds_count") == 0.0
    assert value(service, "rtt_trainer_retrains_total", {"reason": "drift", "outcome": "failed"}) == 1.0
    assert service._producer.sent == []  # type: ignore[union-attr]


# -- a lost model with no samples to train its replacement on


def checks_with_retrains(service: TrainerService, n: int) -> None:
    """``n`` registry checks, each followed by the retrains it started (to their end)."""
    async def go() -> None:
        for _ in range(n):
            await service.check_registry()
            await asyncio.gather(*service._tasks)

    asyncio.run(go())


def test_a_lost_model_with_no_samples_is_named_once_until_what_the_check_finds_changes(
        service: TrainerService, caplog: pytest.LogCaptureFixture) -> None:
    """upload:cpu was announced, the registry has nothing for it, the trainer no sample: each check retrains it
    (insufficient_data), but says so once -- one WARNING naming the lost model and one INFO for its retrain over
    five checks, where it used to log both on every check, forever. A sample arriving changes what its retrain
    finds (said once more, the check's line not); another version announced changes what the check finds (both
    said once more)."""
    caplog.set_level(logging.INFO)
    lost = "upload:cpu"

    def announced(version: int) -> None:
        service._note_announced({"model_key": lost, "version": version, "sha256": f"{version:02d}" * 32})

    def said() -> list[tuple[str, str]]:
        return [(r.levelname, r.getMessage()) for r in caplog.records
                if lost in r.getMessage() and r.levelno >= logging.INFO]

    announced(3)
    checks_with_retrains(service, 5)
    lines = said()
    assert [level for level, _ in lines] == ["WARNING", "INFO"], lines
    assert "the registry lost it" in lines[0][1] and "announced v3" in lines[0][1], lines
    assert lines[1][1] == f"retrain of {lost}: only 0 samples", lines
    assert [o.outcome for o in service.outcomes] == ["insufficient_data"] * 5  # still tried on every check
    assert value(service, "rtt_trainer_retrains_total", {"reason": REGISTRY_LOST, "outcome": "insufficient_data"}) == 5

    caplog.clear()
    service.history.add({**samples(1)[0], "model_key": lost, "app": "upload", "node_class": "cpu"})
    checks_with_retrains(service, 3)
    assert said() == [("INFO", f"retrain of {lost}: only 1 samples")], said()

    caplog.clear()
    announced(4)  # a replica announced another version: what the check finds changed
    checks_with_retrains(service, 3)
    assert [level for level, _ in said()] == ["WARNING", "INFO"], said()
    assert "announced v4" in said()[0][1]
    service._executor.shutdown(wait=True)
