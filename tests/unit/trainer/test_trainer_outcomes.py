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
