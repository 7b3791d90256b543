"""A rollback that lands while a retrain waits to be registered, on the real directory store.

The trainer judges its challenger against the current version, then waits for model-updates to be read (up to
``catch_up_timeout_s`` when Kafka is slow) before it registers. The operator's rollback lands in that wait, from the
model-updates consumer's own ``end_offsets`` call: the challenger must not replace it unless it beats the model
rolled back to as well.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trainer_samples import KEY, AtTheEnd, Producer, trainer

from app.config import Settings
from app.registry.directory import DirectoryModelStore
from app.trainer.pipeline import train_challenger
from app.trainer.registry import ModelRegistry
from app.trainer.rollback import plan_rollback, roll_back
from app.trainer.service import Outcome, TrainerService

FAST = {"n_estimators": 60}


class RollbackInTheWait(AtTheEnd):
    """The model-updates consumer: while the trainer waits for it, before it registers, an operator rolls
    ``store``'s key back to ``to_version`` (the CLI's plan and rollback, on a registry of its own)."""

    def __init__(self, store: DirectoryModelStore, to_version: int) -> None:
        self.store = store
        self.to_version = to_version
        self.rolled: dict[str, Any] | None = None

    async def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        if self.rolled is None:
            operator = ModelRegistry(store=DirectoryModelStore(self.store.path))
            self.rolled = roll_back(operator, plan_rollback(self.store, KEY, self.to_version))
        return {}


@pytest.fixture
def service(tmp_path: Path) -> TrainerService:
    """A trainer on a directory store with 700 samples of :data:`KEY`, Kafka that answers at once."""
    root = tmp_path / "models"
    settings = Settings.from_env({}, models_dir=str(root))
    return trainer(settings, DirectoryModelStore(root), FAST)


def retrain(service: TrainerService) -> Outcome:
    async def go() -> Outcome:
        return await service.retrain({"model_key": KEY, "reason": "drift", "ts": time.time(), "onset_ts": None})

    return asyncio.run(go())


def register_bad(service: TrainerService, seed: int) -> int:
    """A model trained on shuffled RTTs, registered and made current; its version."""
    ds = service.history.dataset(KEY)
    bad = train_challenger(dataclasses.replace(ds, y=np.random.default_rng(seed).permutation(ds.y)), "gpu",
                           params=FAST, selector=None)
    return int(service.registry.register(KEY, bad)["version"])


def test_a_rollback_landing_while_the_challenger_waits_is_not_overwritten(
        service: TrainerService, caplog: pytest.LogCaptureFixture) -> None:
    """v1 good (the trainer's own), v2 bad; the retrain's challenger (as good as v1) beats v2, then the operator
    rolls back to v1 while the trainer reads model-updates: judged again against the model rolled back to, the
    challenger loses, nothing is saved, the rollback stays current and nothing is announced."""
    store = service.registry.store
    assert isinstance(store, DirectoryModelStore)
    assert retrain(service).outcome == "promoted"  # v1
    assert register_bad(service, seed=1) == 2
    gate = RollbackInTheWait(store, to_version=1)
    service._updates = gate  # type: ignore[assignment]
    producer = service._producer
    assert isinstance(producer, Producer)
    sent = len(producer.sent)
    caplog.set_level(logging.INFO)

    outcome = retrain(service)
    service._executor.shutdown(wait=True)

    assert gate.rolled is not None and gate.rolled["version"] == 3
    current = store.current(KEY)
    assert current is not None and (current.version, current.restores) == (3, 1), "the rollback was overwritten"
    assert [r.version for r in store.versions(KEY)] == [1, 2, 3]  # the challenger saved nothing
    assert outcome.outcome == "rejected" and outcome.verdict is not None, outcome
    assert outcome.verdict.reason == "not_better"
    assert len(producer.sent) == sent  # nothing announced
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"retrain of {KEY}: the current model changed to v3 while the challenger waited to be registered: " \
           "judging it again" in said
    assert f"retrain of {KEY}: the current version changed to v3 while the challenger waited to be registered, " \
           "and the challenger does not beat it (not_better): rejected" in said


def test_a_challenger_that_beats_the_model_rolled_back_to_replaces_it(service: TrainerService) -> None:
    """v1 and v2 bad; the operator rolls back to v1 while the good challenger waits: judged again against v1's
    model, it still wins, and is registered in place of the rollback (v3), above it."""
    store = service.registry.store
    assert isinstance(store, DirectoryModelStore)
    assert (register_bad(service, seed=1), register_bad(service, seed=2)) == (1, 2)
    gate = RollbackInTheWait(store, to_version=1)
    service._updates = gate  # type: ignore[assignment]

    outcome = retrain(service)
    service._executor.shutdown(wait=True)

    assert gate.rolled is not None and gate.rolled["version"] == 3
    assert (outcome.outcome, outcome.version) == ("promoted", 4), outcome
    assert outcome.verdict is not None and outcome.verdict.reason == "better"
    assert service.registry.champion_version(KEY) == 3  # the verdict that stands is against the rollback
    current = store.current(KEY)
    assert current is not None and current.version == 4 and current.restores is None
    producer = service._producer
    assert isinstance(producer, Producer) and [u["version"] for u in producer.sent] == [4]
