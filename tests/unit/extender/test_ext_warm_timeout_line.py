"""The line of a warm start from Redis that timed out says so, and which setting bounds it."""

from __future__ import annotations

import asyncio
import logging

import app.extender.service as service_module
from app.config import Settings
from app.extender.options import ExtenderOptions
from app.extender.service import ExtenderService
from app.scheduler.policy import Policy


async def test_a_warm_start_that_times_out_names_the_timeout_and_its_setting(monkeypatch, caplog):
    async def never(*args: object) -> None:
        await asyncio.sleep(3600)

    monkeypatch.setattr(service_module, "warm_start", never)
    service = ExtenderService(Settings(), ExtenderOptions(warm_timeout_s=0.05), policy=Policy(), publish=False,
                              kafka=False, redis=False)
    with caplog.at_level(logging.WARNING, logger="app.extender.service"):
        await service._warm_start()
    assert [r.getMessage() for r in caplog.records] == [
        "warm start from redis skipped: timed out after 0.05s (RTT_EXTENDER_WARM_TIMEOUT_S); the Kafka feed will "
        "make the view ready"]
