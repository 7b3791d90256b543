"""A registry check that cannot reach the registry (Redis away, a wrong password) degrades the
trainer: ``rtt_trainer_degraded{reason="model_store"}`` is 1 and one WARNING says so, until a check reaches it (one
INFO line, the gauge 0). It said one INFO line per check and left the gauge at 0, so a trainer with a wrong Redis
password looked healthy until its first retrain. The gauge is 1 while either the check or a waiting retrain finds
the registry unavailable: neither clears what the other still finds."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from trainer_samples import KEY, trainer

from app.config import Settings
from app.model.errors import RegistryUnavailableError
from app.registry.base import ModelRecord
from app.registry.directory import DirectoryModelStore
from app.trainer.metrics import MODEL_STORE
from app.trainer.service import TrainerService

AWAY = "model registry at test unavailable: AuthenticationError: invalid username-password pair"
LOGGER = "app.trainer.agreement"


class Store(DirectoryModelStore):
    """A directory store that raises the registry unavailable while ``away``."""

    away = False

    def _here(self) -> None:
        if self.away:
            raise RegistryUnavailableError(AWAY)

    def keys(self) -> list[str]:
        self._here()
        return super().keys()

    def current(self, model_key: str) -> ModelRecord | None:
        self._here()
        return super().current(model_key)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "models")


@pytest.fixture
def service(tmp_path: Path, store: Store) -> TrainerService:
    return trainer(Settings.from_env({}, models_dir=str(tmp_path / "models")), store, {"n_estimators": 5})


def degraded(service: TrainerService) -> float | None:
    return service.metrics.registry.get_sample_value("rtt_trainer_degraded", {"reason": MODEL_STORE})


def check(service: TrainerService) -> bool:
    """One registry check; whether it reached the registry."""
    async def go() -> bool:
        try:
            await service.check_registry()
        except RegistryUnavailableError:
            return False
        return True

    return asyncio.run(go())


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


def test_a_check_that_cannot_reach_the_registry_degrades_the_trainer_until_one_does(
        service: TrainerService, store: Store, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    assert check(service) and degraded(service) == 0.0
    store.away = True
    assert [check(service) for _ in range(3)] == [False] * 3
    assert degraded(service) == 1.0
    assert lines(caplog, logging.WARNING) == [f"registry check: {AWAY}; degraded (model_store) until a check reaches"
                                              " it"]
    assert not lines(caplog, logging.INFO)

    store.away = False
    caplog.clear()
    assert check(service) and check(service)
    assert degraded(service) == 0.0
    assert lines(caplog, logging.INFO) == ["registry check: the model registry answers again"]
    assert not lines(caplog, logging.WARNING)

    store.away = True  # another outage: said again
    caplog.clear()
    assert not check(service)
    assert degraded(service) == 1.0 and len(lines(caplog, logging.WARNING)) == 1


def test_the_watcher_says_it_once_not_on_every_check(tmp_path: Path, store: Store,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """The check running on its own every ``registry_check_s``, as in the trainer: no line per check."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    service = trainer(Settings.from_env({}, models_dir=str(tmp_path / "models")), store, {"n_estimators": 5})
    service.registry_check_s = 0.01
    store.away = True

    async def watch(seconds: float) -> None:
        task = asyncio.create_task(service._watch_registry())
        await asyncio.sleep(seconds)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(watch(0.3))
    assert degraded(service) == 1.0
    assert [r.levelname for r in caplog.records if r.name == LOGGER] == ["WARNING"]
    store.away = False
    asyncio.run(watch(0.1))
    assert degraded(service) == 0.0
    assert [r.levelname for r in caplog.records if r.name == LOGGER] == ["WARNING", "INFO"]


def test_a_waiting_retrain_and_the_check_do_not_clear_what_the_other_finds(
        service: TrainerService, store: Store) -> None:
    exc = RegistryUnavailableError(AWAY)
    # a retrain waits (a models directory that takes no write, say) while the check reads the registry fine
    service._registry_away(KEY, exc)
    assert check(service) and degraded(service) == 1.0
    service._registry_wait_over(KEY)
    assert degraded(service) == 0.0
    # the check cannot reach it while a retrain's wait ends: still degraded, until the check reaches it
    store.away = True
    assert not check(service)
    service._registry_away(KEY, exc)
    service._registry_wait_over(KEY)
    assert degraded(service) == 1.0
    store.away = False
    assert check(service) and degraded(service) == 0.0
