"""The trainer's stop ends, whatever it waits on: SIGTERM must stop a trainer.

Python 3.11's ``asyncio.wait_for`` returns the awaited result, and drops the cancel, when the cancel comes as that
result lands: the broker-check loop, cancelled by ``stop()`` as its look at the broker was answered, ran on, and
``stop()`` waited for it without end. ``stop()`` now also gives up on a task or a Kafka client that does not end, after
``stop_timeout_s``, with one WARNING naming it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from lost_cancel import stubborn

from app.config import Settings
from app.trainer.service import TrainerService


def trainer(tmp_path: Path, **kw: Any) -> TrainerService:
    return TrainerService(Settings.from_env({}, models_dir=str(tmp_path)), registry_check_s=0, **kw)


class AnsweredAsCancelled:
    """A producer whose client's metadata look is answered in the same turn of the loop as ``victim`` is cancelled."""

    def __init__(self) -> None:
        self.victim: asyncio.Task[Any] | None = None
        self.looks = 0
        self.client = self

    async def fetch_all_metadata(self) -> object:
        await asyncio.sleep(0)
        self.looks += 1
        assert self.victim is not None
        asyncio.get_running_loop().call_soon(self.victim.cancel)  # the stop's cancel, as the answer lands
        return object()


async def test_the_broker_check_ends_when_cancelled_as_its_look_is_answered(tmp_path: Path) -> None:
    service = trainer(tmp_path, broker_check_s=0.05)
    producer = AnsweredAsCancelled()
    service._producer = producer  # type: ignore[assignment]
    task = asyncio.get_running_loop().create_task(service._watch_broker())
    producer.victim = task
    try:
        await asyncio.wait([task], timeout=2.0)
        assert task.cancelled(), f"the broker check ran on after {producer.looks} looks, each cancelled"
        assert producer.looks == 1
    finally:
        producer.victim = None
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_retrain_waiting_for_the_samples_loop_ends_when_cancelled(tmp_path: Path) -> None:
    service = trainer(tmp_path)
    service._reading = asyncio.Event()
    reached = asyncio.Event()

    async def caught_up(*_a: Any) -> bool:
        reached.set()
        return True

    service._caught_up = caught_up  # type: ignore[method-assign,assignment]
    task = asyncio.get_running_loop().create_task(service.catch_up())
    await asyncio.sleep(0.05)
    service._reading.set()  # and the cancel in the same turn: the wait is over, the retrain is cancelled
    task.cancel()
    await asyncio.wait([task], timeout=2.0)
    assert task.cancelled() and not reached.is_set()


async def test_stop_gives_up_on_a_task_that_does_not_end_when_cancelled(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    service = trainer(tmp_path)
    service.stop_timeout_s = 0.5
    released = asyncio.Event()
    task = service._spawn(stubborn(released), "stubborn")
    await asyncio.sleep(0)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="app.trainer.service"):
        stopping = asyncio.ensure_future(service.stop())
        await asyncio.wait([stopping], timeout=5.0)
    took = time.monotonic() - t0
    released.set()  # the task ends: a stop that still waited for it ends too
    await asyncio.wait_for(asyncio.gather(stopping, task, return_exceptions=True), 5.0)
    assert took < 3.0, f"stop() still waited for the task {took:.1f} s after it began"
    said = [r.getMessage() for r in caplog.records if r.name == "app.trainer.service"]
    assert any(m.startswith("trainer stopping: stubborn still running") for m in said), said


class HangingClient:
    """A Kafka client whose stop waits on a broker that never answers."""

    def __init__(self) -> None:
        self.stopping = asyncio.Event()

    async def stop(self) -> None:
        self.stopping.set()
        await asyncio.Event().wait()


async def test_stop_gives_up_on_a_client_whose_stop_does_not_end(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    service = trainer(tmp_path)
    service.stop_timeout_s = 0.5
    producer = HangingClient()
    service._producer = producer  # type: ignore[assignment]
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="app.trainer.service"):
        await asyncio.wait_for(service.stop(), 5.0)
    assert producer.stopping.is_set() and time.monotonic() - t0 < 3.0
    said = [r.getMessage() for r in caplog.records if r.name == "app.trainer.service"]
    assert any(m.startswith("trainer stopping: the producer did not end within") for m in said), said


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_a_stop_timeout_that_is_not_a_positive_finite_number_is_refused(tmp_path: Path, bad: float) -> None:
    with pytest.raises(ValueError, match="stop_timeout_s must be > 0 and finite"):
        trainer(tmp_path, stop_timeout_s=bad)


async def test_stop_does_not_wait_past_its_deadline_for_a_training_in_its_thread(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A training (or a registry save) runs in the trainer's thread, where a cancel does not reach it: ``stop()``
    waited for it with the event loop blocked, however long it ran past ``stop_timeout_s``."""
    service = trainer(tmp_path)
    service.stop_timeout_s = 0.5
    release = threading.Event()
    training = service._executor.submit(release.wait, 10.0)
    queued = service._executor.submit(lambda: None)
    ticks: list[float] = []

    async def ticking() -> None:
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.05)

    ticker = asyncio.get_running_loop().create_task(ticking())
    try:
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="app.trainer.service"):
            stopping = asyncio.ensure_future(service.stop())
            await asyncio.wait([stopping], timeout=5.0)
        took = time.monotonic() - t0
        stopped = stopping.done()
        gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    finally:
        release.set()  # the training ends: its thread too
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
        await asyncio.wait_for(asyncio.gather(stopping, return_exceptions=True), 15.0)
    assert stopped and took < 3.0, f"stop() waited {took:.1f} s for the training"
    assert max(gaps) < 2.5, f"the event loop was blocked {max(gaps):.1f} s while stop() waited"
    assert queued.cancelled() and not training.cancelled()
    said = [r.getMessage() for r in caplog.records if r.name == "app.trainer.service"]
    assert any(m.startswith("trainer stopping: the training or registry call running in its thread did not end")
               for m in said), said
    training.result(timeout=5.0)  # left to finish, it did
