"""The trainer says when its broker does not answer, on the real embedded broker: stopped under a running trainer,
``rtt_trainer_degraded{reason="kafka"}`` goes to 1 with one WARNING however many looks find it away; started again
on the same port, the gauge goes back to 0 with one INFO. Before, nothing in the trainer's metrics said it ran
without its broker (its consumers return empty fetches and retry by themselves)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from app.config import Settings
from app.kafka.admin import ensure_topics
from app.kafka.embedded import EmbeddedBroker, free_port
from app.trainer.service import TrainerService

pytestmark = pytest.mark.integration


async def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_the_trainer_s_broker_stopped_sets_its_kafka_reason_and_started_again_clears_it(
        settings_factory: Callable[..., Settings], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="app.trainer")
    port = free_port()
    broker = await asyncio.to_thread(EmbeddedBroker(port=port).start)
    settings = settings_factory(kafka_bootstrap=broker.bootstrap)
    try:
        await ensure_topics(settings)
        service = TrainerService(settings, registry_check_s=0, broker_check_s=0.5, catch_up_timeout_s=5.0)

        def kafka() -> Any:
            return service.metrics.registry.get_sample_value("rtt_trainer_degraded", {"reason": "kafka"})

        async with service:
            await asyncio.sleep(1.5)  # three looks with the broker there
            assert kafka() == 0.0

            await asyncio.to_thread(broker.stop)
            await wait_for(lambda: kafka() == 1.0, 30.0, "the stopped broker in rtt_trainer_degraded")
            await asyncio.sleep(2.0)  # more looks find it away: said once
            assert kafka() == 1.0

            broker = EmbeddedBroker(port=port)
            await asyncio.to_thread(broker.start)
            # the trainer's clients may reach the new broker (in memory, empty) first and have its topics
            # auto-created with the broker's defaults: made again as the contracts say
            await ensure_topics(settings, recreate=True)
            await wait_for(lambda: kafka() == 0.0, 30.0, "the broker's return clearing rtt_trainer_degraded")
            assert service.crashed is not None and not service.crashed.is_set()
    finally:
        await asyncio.to_thread(broker.stop)
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.getMessage().startswith(("degraded (kafka)",
                                                                                                 "Kafka at"))]
    assert [level for level, _ in said] == ["WARNING", "INFO"], said
    assert said[0][1].startswith(f"degraded (kafka): Kafka at 127.0.0.1:{port} not answering ("), said
    assert said[1][1] == f"Kafka at 127.0.0.1:{port} answers again", said
