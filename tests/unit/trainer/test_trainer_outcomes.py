"""The trainer keeps the outcomes of its newest retrains and coalesced events only, however long it runs."""

from __future__ import annotations

from pathlib import Path

from app.config import Settings
from app.trainer import service as trainer_service
from app.trainer.service import TrainerService


def test_outcomes_keep_the_newest_only(tmp_path: Path) -> None:
    bound = trainer_service.OUTCOMES_KEPT
    service = TrainerService(Settings.from_env({}, models_dir=str(tmp_path)))
    key = "gCTF:gpu"
    service._training.add(key)  # a retrain of the key is running: every event coalesces (one outcome each)
    for i in range(3 * bound):
        assert service.submit({"model_key": key, "reason": f"drift-{i}", "ts": float(i), "onset_ts": None}) is None
    assert len(service.outcomes) == bound
    assert [service.outcomes[0].reason, service.outcomes[-1].reason] == [f"drift-{2 * bound}", f"drift-{3 * bound - 1}"]
    assert {o.outcome for o in service.outcomes} == {"coalesced"}


async def test_a_readiness_check_that_cannot_run_keeps_the_retrain_waiting(tmp_path: Path, monkeypatch,
                                                                           caplog) -> None:
    """The registry's readiness check failing otherwise than "unavailable" (a Redis user not allowed the probe's
    command) is "not ready yet": the retrain keeps waiting, logged, instead of ending without an outcome."""
    import logging

    from app.model.errors import RegistryUnavailableError
    from app.trainer.service import Outcome

    service = TrainerService(Settings.from_env({"RTT_RETRY_MAX_BACKOFF_S": "0.01"}, models_dir=str(tmp_path)))
    tries = {"retrain": 0, "ready": 0}

    async def retrain(key: str, reason: str, event: dict) -> Outcome:
        tries["retrain"] += 1
        if tries["retrain"] == 1:
            raise RegistryUnavailableError("Redis refuses writes: OOM")
        return Outcome(key, reason, "promoted")

    def ready(key: str) -> None:
        tries["ready"] += 1
        if tries["ready"] < 3:
            raise PermissionError("NOPERM this user has no permissions to run the 'del' command")

    monkeypatch.setattr(service, "_retrain", retrain)
    monkeypatch.setattr(service.registry, "ready", ready)
    with caplog.at_level(logging.WARNING, logger="app.trainer.service"):
        outcome = await service.retrain({"model_key": "gCTF:gpu", "reason": "cold_start", "ts": 1.0})
    assert outcome.outcome == "promoted" and tries == {"retrain": 2, "ready": 3}
    waits = [r for r in caplog.records if "readiness check failed" in r.getMessage()]
    assert len(waits) == 2 and all(r.exc_info is None for r in waits)


async def test_a_challenger_the_registry_gave_up_on_is_a_failed_retrain_without_a_traceback(
        tmp_path: Path, monkeypatch, caplog) -> None:
    import logging

    from app.model.errors import CurrentChangedError

    service = TrainerService(Settings.from_env({}, models_dir=str(tmp_path)))

    async def retrain(key: str, reason: str, event: dict) -> None:
        raise CurrentChangedError(key, 3, 4)

    monkeypatch.setattr(service, "_retrain", retrain)
    with caplog.at_level(logging.WARNING, logger="app.trainer.service"):
        outcome = await service.retrain({"model_key": "gCTF:gpu", "reason": "drift", "ts": 1.0})
    assert outcome.outcome == "failed" and "CurrentChangedError" in outcome.detail
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
