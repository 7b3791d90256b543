"""What the trainer keeps of model-updates (the newest version per key, and above what a save goes), a read of
model-updates from its start again, and what the registry check does in each case: a promotion found unannounced is
announced at the second check in a row, untimed; a lost model's retrain event; a key being trained is skipped."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from trainer_samples import Producer, trainer

from app.clock import ManualClock
from app.config import Settings
from app.contracts import contract
from app.kafka.batches import partition_for
from app.registry.base import ModelRecord
from app.registry.directory import DirectoryModelStore
from app.trainer.agreement import REGISTRY_LOST
from app.trainer.metrics import MODEL_STORE
from app.trainer.service import TrainerService

A, Z = "appa:cpu", "zzz:cpu"  # checked in this order


@pytest.fixture
def store(tmp_path: Path) -> DirectoryModelStore:
    return DirectoryModelStore(tmp_path / "models")


@pytest.fixture
def service(tmp_path: Path, store: DirectoryModelStore) -> TrainerService:
    settings = Settings.from_env({}, models_dir=str(tmp_path / "models"), retry_max_backoff_s=0.05)
    return trainer(settings, store, {"n_estimators": 5})


def put(store: DirectoryModelStore, key: str, blob: bytes = b"model") -> ModelRecord:
    """``blob`` saved as ``key``'s next version and made current."""
    current = store.current(key)
    return store.save(key, blob, fmt="json", features=["a"], params={}, metrics={}, n_samples=1,
                      replacing=current.version if current is not None else 0)


def note(service: TrainerService, key: str, version: int, sha: str = "a" * 64) -> None:
    service._note_announced({"model_key": key, "version": version, "sha256": sha})


def announce(service: TrainerService, record: ModelRecord) -> None:
    note(service, record.model_key, record.version, record.sha256)


def checks(service: TrainerService, n: int = 1) -> tuple[list[list[str]], list[dict[str, Any]]]:
    """``n`` registry checks: what each acted on, and the retrain events they started (only noted)."""
    started: list[dict[str, Any]] = []

    def submit(event: dict[str, Any], mark: Any = None) -> Any:
        started.append(event)
        return object()

    service.submit = submit  # type: ignore[method-assign]

    async def go() -> list[list[str]]:
        return [await service.check_registry() for _ in range(n)]

    return asyncio.run(go()), started


def sample(service: TrainerService, name: str, labels: dict[str, str] | None = None) -> float | None:
    return service.metrics.registry.get_sample_value(name, labels or {})


def test_an_older_announcement_read_later_changes_neither_the_newest_nor_the_floor(service: TrainerService) -> None:
    note(service, A, 5, "b" * 64)
    note(service, A, 3)
    assert service.announced[A] == (5, "b" * 64)
    assert service._newest_announced(A) == 5
    assert sample(service, "rtt_trainer_model_version", {"model_key": A}) == 5.0


def test_the_same_version_announced_again_is_known_by_its_newest_announcement(service: TrainerService) -> None:
    note(service, A, 4)
    note(service, A, 4, "c" * 64)
    assert service.announced[A] == (4, "c" * 64)


def test_a_partition_read_from_its_start_again_forgets_its_keys_only_and_keeps_the_floor(
        service: TrainerService) -> None:
    n = contract("model-updates").partitions
    keys = [f"k{i}:cpu" for i in range(40)]
    for key in keys:
        note(service, key, 2)
    reset = partition_for(keys[0].encode(), n)
    service._updates_reset([TopicPartition("model-updates", reset)])
    assert sorted(service.announced) == sorted(k for k in keys if partition_for(k.encode(), n) != reset)
    assert len(service.announced) < len(keys)
    assert all(service._newest_announced(k) == 2 for k in keys)


def test_a_promotion_never_announced_is_announced_untimed_at_the_second_check(
        service: TrainerService, store: DirectoryModelStore) -> None:
    v1 = put(store, A)
    producer = service._producer
    assert isinstance(producer, Producer)
    observed = sample(service, "rtt_trainer_drift_to_promotion_seconds_count") or 0.0
    acted, started = checks(service)
    assert (acted, producer.sent) == ([[]], [])  # the trainer may be announcing it right now
    acted, started = checks(service)
    assert acted == [[A]] and not started
    assert [(m["model_key"], m["version"], m["sha256"]) for m in producer.sent] == [(A, 1, v1.sha256)]
    assert (sample(service, "rtt_trainer_drift_to_promotion_seconds_count") or 0.0) == observed
    assert checks(service)[0] == [[]]  # in agreement now


def test_a_current_version_whose_announcement_went_with_a_recreated_topic_is_announced_again(
        service: TrainerService, store: DirectoryModelStore) -> None:
    announce(service, put(store, A))
    service._updates_reset([TopicPartition("model-updates", p) for p in range(contract("model-updates").partitions)])
    acted, started = checks(service, 2)
    assert acted == [[], [A]] and not started


def test_a_lost_model_s_retrain_event_is_the_registry_s_at_the_check_s_time(service: TrainerService) -> None:
    service.clock = ManualClock(1_700_000_000.0)
    note(service, A, 3)  # announced, the registry holds nothing of it
    acted, started = checks(service)
    assert acted == [[A]]
    assert started == [{"model_key": A, "reason": REGISTRY_LOST, "ts": 1_700_000_000.0, "onset_ts": None}]


def test_a_key_saved_but_never_current_nor_announced_is_left_alone(service: TrainerService,
                                                                   store: DirectoryModelStore) -> None:
    store.save(A, b"model", fmt="json", features=["a"], params={}, metrics={}, n_samples=1)
    assert store.current(A) is None and A in store.keys()
    assert checks(service) == ([[]], [])


def test_a_key_being_trained_is_skipped_and_the_keys_after_it_are_checked(service: TrainerService) -> None:
    note(service, A, 3)
    note(service, Z, 3)
    service._training.add(A)
    acted, started = checks(service)
    assert acted == [[Z]] and [e["model_key"] for e in started] == [Z]
    assert sample(service, "rtt_trainer_degraded", {"reason": "registry_unreadable"}) == 0.0


def test_a_retrain_waiting_for_the_registry_keeps_the_trainer_degraded_when_the_check_reaches_it(
        service: TrainerService) -> None:
    service._check_away = "model registry unavailable"
    service._waiting.add(A)
    checks(service)
    assert service._check_away is None
    assert sample(service, "rtt_trainer_degraded", {"reason": MODEL_STORE}) == 1.0
