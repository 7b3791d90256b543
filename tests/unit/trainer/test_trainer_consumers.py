"""The trainer's consumer loops outlive broker errors, and its retrain-events are committed as their retrains end."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError, OffsetOutOfRangeError
from aiokafka.structs import ConsumerRecord
from prometheus_client import CollectorRegistry

from app.config import Settings
from app.kafka.commits import GroupCommits
from app.kafka.positions import PositionGuard
from app.trainer import service as trainer_service
from app.trainer.service import Outcome, TrainerService

TP = TopicPartition("model-updates", 0)
KEY = "gCTF:gpu"


class FlakyConsumer:
    """Out of range on fetch, then the broker goes away: beginning_offsets and end_offsets time out."""

    def __init__(self, batch: dict[TopicPartition, list[Any]] | None = None) -> None:
        self.batch = batch

    def assignment(self) -> set[TopicPartition]:
        return {TP}

    def highwater(self, tp: TopicPartition) -> int:
        return 0  # below every position: the guard asks the broker's end offset

    async def getmany(self, **kw: Any) -> dict[TopicPartition, list[Any]]:
        if self.batch is not None:
            return self.batch
        raise OffsetOutOfRangeError({TP: 500})

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        raise KafkaTimeoutError()

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        raise KafkaTimeoutError()


@pytest.fixture
def service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TrainerService:
    monkeypatch.setattr(trainer_service, "RETRY_S", 0.01)
    return TrainerService(Settings.from_env({}, models_dir=str(tmp_path)), registry_check_s=0)


def guard(consumer: Any, confirm_s: float = 1.0) -> PositionGuard:
    return PositionGuard(consumer, "trainer-updates", registry=CollectorRegistry(), confirm_s=confirm_s)


def test_a_broker_error_while_an_out_of_range_position_is_reset_is_waited_out(service: TrainerService) -> None:
    consumer = FlakyConsumer()
    assert asyncio.run(service._fetch(consumer, guard(consumer), timeout_ms=10)) == {}  # type: ignore[arg-type]


def test_the_model_updates_loop_outlives_it(service: TrainerService) -> None:
    consumer = FlakyConsumer()
    service._updates = consumer  # type: ignore[assignment]
    service._update_guard = guard(consumer)

    async def go() -> bool:
        loop = asyncio.get_running_loop().create_task(service._consume_updates())
        await asyncio.sleep(0.2)
        ended = loop.done()
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        return ended

    assert asyncio.run(go()) is False


def test_a_fetched_batch_is_kept_when_the_check_after_it_fails(service: TrainerService) -> None:
    record = ConsumerRecord(TP.topic, TP.partition, 7, 0, 0, b"k", b"v", None, 1, 1, ())
    consumer = FlakyConsumer({TP: [record]})
    assert asyncio.run(service._fetch(consumer, guard(consumer, confirm_s=0.0), timeout_ms=10)) == {TP: [record]}  # type: ignore[arg-type]


class Events:
    """The group consumer GroupCommits commits through (what it committed is in ``commits``)."""

    def __init__(self) -> None:
        self.commits: list[dict[TopicPartition, int]] = []

    def assignment(self) -> set[TopicPartition]:
        return {TP}

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append(dict(offsets))


def test_an_event_is_committed_once_the_retrain_it_started_or_joined_ended(service: TrainerService,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    events = Events()
    commits = service._commits = GroupCommits(events, guard(events))
    commits.ledger.start(TP, 0)
    release = asyncio.Event()

    async def retrain(event: dict[str, Any]) -> Outcome:
        await release.wait()
        return Outcome(event["model_key"], event["reason"], "rejected")

    monkeypatch.setattr(service, "retrain", retrain)

    def event(reason: str) -> dict[str, Any]:
        return {"model_key": KEY, "reason": reason, "ts": 0.0, "onset_ts": None}

    async def go() -> list[dict[TopicPartition, int]]:
        first = service.submit(event("drift"), commits.read(TP, 0))
        assert first is not None
        assert service.submit(event("growth"), commits.read(TP, 1)) is None  # coalesced into the running one
        await asyncio.sleep(0.01)
        assert await commits.flush() and events.commits == []  # both open: nothing to commit
        release.set()
        await first
        await commits.flush()
        release.clear()
        stopped = service.submit(event("manual"), commits.read(TP, 2))  # the trainer stops during this one
        assert stopped is not None
        await asyncio.sleep(0.01)
        stopped.cancel()
        await asyncio.gather(stopped, return_exceptions=True)
        await commits.flush()
        return events.commits

    assert asyncio.run(go()) == [{TP: 2}]  # the cancelled retrain's event stays uncommitted: read again
