"""A trainer whose Redis refuses its password, or is away, is degraded from its first registry check, not from its
first retrain: ``rtt_trainer_degraded{reason="model_store"}`` 1 with one WARNING naming the registry, and 0 with one
INFO line once a check reaches it again. On the real broker and a redis-server of the test's own (one that asks for
a password the trainer's file does not hold; one stopped and started again)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

import pytest
import redis
from fault_stack import RedisServer
from redis_servers import server
from test_trainer import FAST, wait_for

from app.config import Settings
from app.trainer.service import TrainerService

pytestmark = pytest.mark.integration
__all__ = ["server"]  # the fixture, used here

LOGGER = "app.trainer.agreement"
CHECK_S = 0.2


def degraded(service: TrainerService) -> float | None:
    return service.metrics.registry.get_sample_value("rtt_trainer_degraded", {"reason": "model_store"})


def said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == LOGGER and r.levelno >= logging.INFO]


async def test_a_wrong_redis_password_degrades_the_trainer_at_its_first_check(
        kafka_settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    (tmp_path / "redis").mkdir()
    redis_server = RedisServer(tmp_path / "redis", persist=False, password="right-pw").start()
    wrong = tmp_path / "redis-password"
    wrong.write_text("wrong-pw\n")
    try:
        settings = dataclasses.replace(kafka_settings, redis_url=redis_server.url, redis_password_file=str(wrong))
        service = TrainerService(settings, train_params=FAST, catch_up_timeout_s=15.0, registry_check_s=CHECK_S)
        async with service:
            assert degraded(service) == 0.0
            await wait_for(lambda: degraded(service) == 1.0, 30.0, "the check to find the registry unavailable")
            await asyncio.sleep(5 * CHECK_S)  # more checks, nothing more said
            lines = said(caplog)
            assert len(lines) == 1 and lines[0][0] == "WARNING", lines
            assert lines[0][1].startswith("registry check: model registry at redis://127.0.0.1:")
            assert "wrong-pw" not in lines[0][1] and "right-pw" not in lines[0][1]
            assert degraded(service) == 1.0
            # Redis now asks for the password the trainer has: the next check reaches it
            admin = redis.Redis(host="127.0.0.1", port=redis_server.port, password="right-pw")
            admin.config_set("requirepass", "wrong-pw")
            admin.close()
            await wait_for(lambda: degraded(service) == 0.0, 30.0, "the check to reach the registry again")
            assert said(caplog)[1:] == [("INFO", "registry check: the model registry answers again")]
    finally:
        redis_server.stop()


async def test_redis_stopped_then_started_degrades_the_trainer_then_clears(
        kafka_settings: Settings, server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    settings = dataclasses.replace(kafka_settings, redis_url=server.url)
    service = TrainerService(settings, train_params=FAST, catch_up_timeout_s=15.0, registry_check_s=CHECK_S)
    async with service:
        await wait_for(lambda: service.metrics.registry.get_sample_value("rtt_trainer_degraded",
                                                                         {"reason": "kafka"}) == 0.0, 10, "start")
        server.stop()
        await wait_for(lambda: degraded(service) == 1.0, 30.0, "the check to find Redis away")
        assert [level for level, _ in said(caplog)] == ["WARNING"]
        server.start()
        await wait_for(lambda: degraded(service) == 0.0, 30.0, "the check to reach Redis again")
        assert said(caplog)[1:] == [("INFO", "registry check: the model registry answers again")]
        assert [level for level, _ in said(caplog)] == ["WARNING", "INFO"]
