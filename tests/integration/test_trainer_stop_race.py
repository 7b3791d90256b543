"""A trainer on the real broker, asked to stop just as its look at the broker is answered, stops.

``asyncio.wait_for`` of Python 3.11 drops a cancel that comes as the awaited call returns: the trainer's broker check,
cancelled by ``stop()`` at that moment, ran on (a look every ``broker_check_s``), and ``stop()`` waited for it
without end: a trainer that SIGTERM did not stop, and a test that hung until pytest's timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from app.config import Settings
from app.trainer.service import TrainerService

pytestmark = pytest.mark.integration


async def test_a_trainer_stopped_as_its_broker_look_is_answered_stops(kafka_settings: Settings,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    service = TrainerService(kafka_settings, registry_check_s=0, broker_check_s=0.5, catch_up_timeout_s=5.0)
    await service.start()
    assert service._producer is not None
    client = service._producer.client
    real = client.fetch_all_metadata
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Future[None]] = []
    answered = asyncio.Event()

    async def look() -> Any:
        answer = await real()  # the broker's own answer
        if not stopping:  # the stop begins in the turn of the loop that hands the answer on
            loop.call_soon(lambda: stopping.append(asyncio.ensure_future(service.stop())))
            answered.set()
        return answer

    client.fetch_all_metadata = look
    caplog.set_level(logging.INFO, logger="app.trainer.service")
    try:
        await asyncio.wait_for(answered.wait(), 10.0)
        await asyncio.sleep(0.1)
        assert stopping
        t0 = time.monotonic()
        await asyncio.wait([stopping[0]], timeout=10.0)
        took = time.monotonic() - t0
    finally:
        if stopping and not stopping[0].done():  # the broker check ran on: cancelled again, it ends
            for task in list(service._tasks):
                task.cancel()
            await asyncio.wait_for(asyncio.gather(stopping[0], return_exceptions=True), 60.0)
        elif not stopping:
            await service.stop()
    assert stopping[0].done() and took < 10.0, "stop() waited on for the broker check it had cancelled"
    said = [r.getMessage() for r in caplog.records if r.name == "app.trainer.service"]
    assert "trainer stopped" in said and not [m for m in said if m.startswith("trainer stopping:")], said
