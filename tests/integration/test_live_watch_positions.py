"""The live run's watcher on the real broker: a topic recreated under it (as after the broker lost its data) is
read again from its start, with the reset logged, not skipped past."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaProducer
from fault_stack import recreate_topic

from app.config import Settings
from app.contracts import encode
from app.sim.live_watch import FeedbackWatcher

pytestmark = pytest.mark.integration

KEY = "gCTF:gpu"


def event(reason: str) -> bytes:
    return encode("retrain-events", {"model_key": KEY, "reason": reason, "cumulative_error": 0.7,
                                     "threshold": 0.5, "ts": time.time(), "onset_ts": None})


async def send(settings: Settings, reasons: list[str]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    await producer.start()
    try:
        for reason in reasons:
            await producer.send_and_wait(settings.topic("retrain-events"), event(reason), key=KEY.encode())
    finally:
        await producer.stop()


async def until(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_a_recreated_topic_is_read_again_from_its_start(kafka_settings: Settings,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    watcher = FeedbackWatcher(kafka_settings, topics=("retrain-events",)).start()
    try:
        await send(kafka_settings, ["drift", "growth", "manual"])
        await until(lambda: len(watcher.retrains) == 3, 10.0, "the first events")
        await recreate_topic(kafka_settings, "retrain-events")
        await until(lambda: watcher.resets == 1, 10.0, "the reset")  # position 3, the new partition empty
        await send(kafka_settings, ["cold_start"])
        await until(lambda: len(watcher.retrains) == 4, 10.0, "the event after the wipe")
        assert [r for _ts, _k, r in watcher.retrains] == ["drift", "growth", "manual", "cold_start"]
        assert "feedback-watcher: read position of" in caplog.text
    finally:
        watcher.close()
