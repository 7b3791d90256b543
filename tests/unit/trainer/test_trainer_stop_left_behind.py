"""What the trainer's stop gives up on is named, all of it in one WARNING, and kept for the process to exit without it.

``rttsched trainer`` exits at once (code 1) after a stop that left something running: Python's exit would join the
training's thread, and ``asyncio.run`` would cancel the tasks left behind again and wait for them without bound.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from lost_cancel import stubborn

from app.config import Settings
from app.trainer.service import TrainerService


class HangingClient:
    """A Kafka client whose stop waits on a broker that never answers."""

    async def stop(self) -> None:
        await asyncio.Event().wait()


async def test_what_the_stop_gave_up_on_is_named_in_one_warning(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    service = TrainerService(Settings.from_env({}, models_dir=str(tmp_path)), registry_check_s=0,
                             stop_timeout_s=0.3)
    released = asyncio.Event()
    task = service._spawn(stubborn(released), "stubborn")
    service._producer = HangingClient()  # type: ignore[assignment]
    await asyncio.sleep(0)
    try:
        with caplog.at_level(logging.INFO, logger="app.trainer.service"):
            await asyncio.wait_for(service.stop(), 10.0)
    finally:
        released.set()
        await asyncio.wait_for(task, 5.0)
    assert service.left_behind == ["stubborn still running 0.3 s after being cancelled",
                                   "the producer did not end within 1.0 s"]
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "app.trainer.service"]
    assert said == [(logging.WARNING, "trainer stopping: stubborn still running 0.3 s after being cancelled; the "
                                      "producer did not end within 1.0 s; stopping without them")], said


async def test_a_clean_stop_leaves_nothing_behind(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    service = TrainerService(Settings.from_env({}, models_dir=str(tmp_path)), registry_check_s=0)
    with caplog.at_level(logging.INFO, logger="app.trainer.service"):
        await asyncio.wait_for(service.stop(), 10.0)
    assert service.left_behind == []
    assert [r.getMessage() for r in caplog.records if r.name == "app.trainer.service"] == ["trainer stopped"]
