"""The worker's model-updates follower on the real broker applies a batch it fetched even when the check of its
read positions after the fetch meets a broker error.

model-updates is recreated (as after a wipe): the position of partition X lies beyond its new end, so the check
after each fetch asks the broker for the ends; while those requests fail (injected on the follower's consumer: the
answer lost, as when the broker goes away right after answering the fetch), an update produced on another
partition Y is fetched. It used to be dropped with the failed check — the consumer's position already past it, so
never read again and the old model kept serving; it is applied now, and X reads on from its start once the broker
answers again.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError
from aiokafka.partitioner import murmur2

from app.config import Settings
from app.contracts import contract
from app.sim.scripted import produce
from app.streams import feedback_models as fm
from app.streams.feedback_models import ModelCache

pytestmark = pytest.mark.integration


def update(key: str, version: int) -> dict[str, Any]:
    return {"model_key": key, "version": version, "sha256": "0" * 64, "features": ["cpu_iowait"], "metrics": {},
            "location": "nowhere", "ts": time.time()}


def two_keys(partitions: int) -> tuple[str, str]:
    """Two model keys on different partitions of model-updates."""
    by_partition: dict[int, str] = {}
    for app in ("gCTF", "upload", "Motioncor2", "a1", "a2", "a3", "a4", "a5"):
        by_partition.setdefault((murmur2(f"{app}:gpu".encode()) & 0x7FFFFFFF) % partitions, f"{app}:gpu")
    x, y = list(by_partition.values())[:2]
    return x, y


async def until(done: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def test_an_update_fetched_while_the_position_check_fails_is_applied(
        kafka_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    s = kafka_settings
    partitions = contract("model-updates").partitions
    topic = s.topic("model-updates")
    kx, ky = two_keys(partitions)
    fail = {"on": False, "calls": 0}
    applied: list[tuple[str, int]] = []

    class Consumer(AIOKafkaConsumer):  # type: ignore[misc]
        """The real consumer; its requests for the partitions' ends fail while ``fail["on"]``."""

        async def end_offsets(self, partitions: Any) -> Any:
            if fail["on"]:
                fail["calls"] += 1
                raise KafkaConnectionError("injected: the ListOffsets answer lost")
            return await super().end_offsets(partitions)

    class Recording(ModelCache):
        async def apply(self, u: dict[str, Any]) -> bool:
            applied.append((u["model_key"], u["version"]))
            return True

    monkeypatch.setattr(fm, "AIOKafkaConsumer", Consumer)
    monkeypatch.setattr(fm, "RETRY_S", 0.2)

    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=s.bootstrap_servers)
        await admin.start()
        task = asyncio.ensure_future(fm.follow_model_updates(s, Recording(s)))
        try:
            await produce(s, [("model-updates", update(kx, v)) for v in (1, 2, 3)])  # X's position: 3
            assert await until(lambda: (kx, 3) in applied, 20), applied  # v1 and v2 superseded if read with it
            first = len(applied)
            await admin.delete_topics([topic])
            await asyncio.sleep(1.0)
            await admin.create_topics([NewTopic(topic, partitions, 1)])
            fail["on"] = True
            # X's position (3) stays beyond its end (0) past the guard's confirm_s: the check asks for the ends
            assert await until(lambda: fail["calls"] >= 1, 20), "the position check never asked the broker"
            await produce(s, [("model-updates", update(ky, 1))])  # Y, offset 0: fetched while the check fails
            assert await until(lambda: (ky, 1) in applied, 10), f"{ky} v1 never applied: {applied}"
            assert fail["calls"] >= 2  # it was fetched with checks failing around it
            fail["on"] = False
            await produce(s, [("model-updates", update(kx, 1))])  # the broker answers: X read from its new start
            assert await until(lambda: (kx, 1) in applied[first:], 20), applied
            assert not task.done()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await admin.close()

    asyncio.run(run())
