"""The trainer's dead letters: each bad message once (marks), again while the broker does not take them, given up
when it never can, and sent anyway when the marks cannot be read."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import zlib
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError
from aiokafka.structs import ConsumerRecord
from redis.exceptions import ConnectionError as RedisConnectionError

from app.clock import ManualClock
from app.config import Settings
from app.contracts import decode
from app.errors import ContractError
from app.trainer import dead_letters as module
from app.trainer.dead_letters import DirectoryMarks, TrainerDeadLetters, mark_ttl_s, open_marks
from app.trainer.metrics import TrainerMetrics


class Producer:
    """Takes sends in memory; ``failures`` are the errors of the next sends' acknowledgements, one per send."""

    def __init__(self, failures: list[BaseException] | None = None) -> None:
        self.failures = list(failures or [])
        self.stored: list[tuple[str, bytes, bytes]] = []

    async def send(self, topic: str, value: bytes, key: bytes) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.failures:
            fut.set_exception(self.failures.pop(0))
        else:
            self.stored.append((topic, key, value))
            fut.set_result(None)
        return fut


class AwayMarks:
    """Marks whose store is away."""

    async def has(self, name: str) -> bool:
        raise RedisConnectionError("connection refused")

    async def add(self, name: str, ttl_s: float | None) -> None:
        raise RedisConnectionError("connection refused")

    async def close(self) -> None:
        return None


def record(offset: int, value: bytes, topic: str = "p-training-samples") -> ConsumerRecord:
    return ConsumerRecord(topic, 2, offset, 0, 0, b"gCTF:gpu", value, None, len(b"gCTF:gpu"), len(value), ())


def letters(producer: Producer) -> list[tuple[int, bytes, str]]:
    out = []
    for _, _, value in producer.stored:
        d = decode("dead-letters", value, strict=True)
        out.append((d["offset"], base64.b64decode(d["raw"]), d["reason"]))
    return out


@pytest.fixture(autouse=True)
def no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module.Backoff, "next", lambda self: 0.0)


def dead(tmp_path: Path, producer: Producer, marks: Any = None) -> TrainerDeadLetters:
    settings = Settings.from_env({}, models_dir=str(tmp_path), topic_prefix="p-")
    return TrainerDeadLetters(settings, TrainerMetrics(), ManualClock(100.0), marks=marks, producer=producer)


def bad(offset: int, value: bytes = b"{") -> tuple[ConsumerRecord, ContractError]:
    return record(offset, value), ContractError("invalid_json", "not JSON")


async def test_each_bad_message_once_in_the_models_directory(tmp_path: Path) -> None:
    assert isinstance(open_marks(Settings.from_env({}, models_dir=str(tmp_path))), DirectoryMarks)
    producer = Producer()
    first = dead(tmp_path, producer)
    assert await first.send("training-samples", [bad(1), bad(4)]) == 2
    # a restarted trainer (new marks object, same directory) reads them again, and a new one
    again = dead(tmp_path, producer)
    assert await again.send("training-samples", [bad(1), bad(4), bad(9)]) == 1
    # the same offset with other bytes (a recreated topic) is another message
    assert await again.send("training-samples", [bad(1, b"[")]) == 1
    assert letters(producer) == [(1, b"{", "invalid_json"), (4, b"{", "invalid_json"), (9, b"{", "invalid_json"),
                                 (1, b"[", "invalid_json")]
    assert {t for t, _, _ in producer.stored} == {"p-dead-letters"}
    reg = again.metrics.registry
    assert reg.get_sample_value("rtt_trainer_dead_letters_total",
                                {"topic": "training-samples", "reason": "invalid_json"}) == 2.0


async def test_not_acknowledged_sent_again_until_stored_refused_for_good_given_up(tmp_path: Path) -> None:
    producer = Producer([KafkaTimeoutError(), MessageSizeTooLargeError(), KafkaTimeoutError()])
    d = dead(tmp_path, producer)
    assert await d.send("training-samples", [bad(1), bad(2), bad(3)]) == 2
    # 1 and 3 timed out, then stored on the next try; 2 refused for good
    assert sorted(o for o, _, _ in letters(producer)) == [1, 3]
    # the one given up has no mark: a later read tries it again
    assert await dead(tmp_path, Producer()).send("training-samples", [bad(1), bad(2), bad(3)]) == 1


async def test_marks_away_the_message_is_dead_lettered_anyway(tmp_path: Path) -> None:
    producer = Producer()
    d = dead(tmp_path, producer, marks=AwayMarks())
    assert await d.send("model-updates", [bad(7)]) == 1
    assert await d.send("model-updates", [bad(7)]) == 1  # a second copy rather than none
    assert [o for o, _, _ in letters(producer)] == [7, 7]


async def test_once_false_never_looks_at_marks(tmp_path: Path) -> None:
    producer = Producer()
    d = dead(tmp_path, producer)
    assert await d.send("retrain-events", [bad(5)], once=False) == 1
    assert await d.send("retrain-events", [bad(5)], once=False) == 1  # the group's commit makes it once
    assert not (tmp_path / "dead-letters").exists()


def stamped(offset: int, timestamp_ms: int, value: bytes = b"{", topic: str = "p-model-updates",
            ) -> tuple[ConsumerRecord, ContractError]:
    rec = ConsumerRecord(topic, 0, offset, timestamp_ms, 0, b"gCTF:gpu", value, None, 8, len(value), ())
    return rec, ContractError("invalid_json", "not JSON")


async def test_the_same_bytes_at_the_same_offset_of_a_recreated_topic_are_a_new_message(tmp_path: Path) -> None:
    producer = Producer()
    assert await dead(tmp_path, producer).send("model-updates", [stamped(0, 1_700_000_000_000)]) == 1
    restarted = dead(tmp_path, producer)
    assert await restarted.send("model-updates", [stamped(0, 1_700_000_000_000)]) == 0  # the same record
    # the topic was recreated: a new record, written later, with the same bytes at the same offset
    assert await restarted.send("model-updates", [stamped(0, 1_700_000_360_000)]) == 1
    assert letters(producer) == [(0, b"{", "invalid_json"), (0, b"{", "invalid_json")]


class KeptMarks:
    """Marks in memory, with the expiry each was stored with."""

    def __init__(self) -> None:
        self.ttl: dict[str, float | None] = {}

    async def has(self, name: str) -> bool:
        return name in self.ttl

    async def add(self, name: str, ttl_s: float | None) -> None:
        self.ttl[name] = ttl_s

    async def replace(self, old: str, name: str, ttl_s: float) -> None:
        del self.ttl[old]
        self.ttl[name] = ttl_s

    async def close(self) -> None:
        return None


async def test_every_mark_expires_a_compacted_topics_with_its_dead_letter(tmp_path: Path) -> None:
    marks = KeptMarks()
    d = dead(tmp_path, Producer(), marks=marks)
    assert await d.send("model-updates", [stamped(3, 5)]) == 1
    assert await d.send("training-samples", [bad(4)]) == 1
    assert sorted(marks.ttl.values()) == [1_209_600.0, 1_209_600.0]  # 14 days: dead-letters', training-samples'


async def test_a_mark_stored_by_the_earlier_release_is_recognised_and_given_an_expiry(tmp_path: Path) -> None:
    earlier = f"p-model-updates.0.7.{zlib.crc32(b'{'):08x}"  # topic, partition, offset, checksum: no timestamp
    marks = KeptMarks()
    marks.ttl[earlier] = None  # as the earlier release stored a model-updates mark: kept for ever
    producer = Producer()
    d = dead(tmp_path, producer, marks=marks)
    assert await d.send("model-updates", [stamped(7, 1_700_000_000_000)]) == 0
    assert marks.ttl == {"p-model-updates.0.7.1700000000000.15d54739": 1_209_600.0}  # renamed, expiring
    assert await d.send("model-updates", [stamped(7, 1_700_000_000_000)]) == 0
    # the topic recreated since: the same bytes at the same offset, written later, are a new message
    assert await d.send("model-updates", [stamped(7, 1_700_000_360_000)]) == 1
    assert len(producer.stored) == 1


async def test_an_earlier_mark_in_the_models_directory_is_recognised(tmp_path: Path) -> None:
    (tmp_path / "dead-letters").mkdir()
    (tmp_path / "dead-letters" / f"p-training-samples.2.4.{zlib.crc32(b'{'):08x}").touch()
    producer = Producer()
    assert await dead(tmp_path, producer).send("training-samples", [bad(1), bad(4)]) == 1
    assert [o for o, _, _ in letters(producer)] == [1]
    assert sorted(p.name for p in (tmp_path / "dead-letters").iterdir()) == [
        "p-training-samples.2.1.0.15d54739", "p-training-samples.2.4.0.15d54739"]


async def test_a_record_without_a_timestamp_is_dead_lettered_once(tmp_path: Path) -> None:
    rec = ConsumerRecord("p-model-updates", 0, 3, None, -1, b"gCTF:gpu", b"{", None, 8, 1, ())  # a v0 record
    producer = Producer()
    d = dead(tmp_path, producer)
    assert await d.send("model-updates", [(rec, ContractError("invalid_json", "not JSON")), bad(5)]) == 2
    assert await d.send("model-updates", [(rec, ContractError("invalid_json", "not JSON"))]) == 0
    assert (tmp_path / "dead-letters" / "p-model-updates.0.3.-1.15d54739").exists()


class FailingMarks(KeptMarks):
    """Marks whose store answers ``answers`` lookups, then is away; counts the lookups."""

    def __init__(self, answers: int = 0) -> None:
        super().__init__()
        self.answers = answers
        self.lookups = 0

    async def has(self, name: str) -> bool:
        self.lookups += 1
        if self.lookups > self.answers:
            raise RedisConnectionError("connection refused")
        return await super().has(name)


async def test_marks_away_one_lookup_and_one_line_naming_its_mark_per_record(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    marks = FailingMarks()
    d = dead(tmp_path, Producer(), marks=marks)
    with caplog.at_level(logging.WARNING, logger=module.__name__):
        assert await d.send("training-samples", [bad(1), bad(2), bad(3)]) == 3
    assert marks.lookups == 3  # each one waits out the store's timeout: the earlier name is not looked up
    assert [r.getMessage().rsplit(" ", 2)[1] for r in caplog.records] == [
        f"p-training-samples.2.{o}.0.15d54739" for o in (1, 2, 3)]


async def test_marks_gone_away_at_the_earlier_name_the_line_names_the_records_mark(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    d = dead(tmp_path, Producer(), marks=FailingMarks(answers=1))  # its mark not there, then the store away
    with caplog.at_level(logging.WARNING, logger=module.__name__):
        assert await d.send("training-samples", [bad(1)]) == 1
    assert [r.getMessage().rsplit(" ", 2)[1] for r in caplog.records] == ["p-training-samples.2.1.0.15d54739"]


class Died(BaseException):
    """The process killed in the middle of a call."""


async def test_an_earlier_mark_in_the_models_directory_is_renamed_in_one_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "dead-letters"
    d.mkdir()
    (d / "p-training-samples.2.4.15d54739").touch()

    def die(*args: Any, **kwargs: Any) -> None:
        raise Died

    monkeypatch.setattr(Path, "unlink", die)  # the process dies at a removal, if the rename takes one
    try:
        assert await dead(tmp_path, Producer()).send("training-samples", [bad(4)]) == 0
    except Died:
        pass
    # the earlier name or the new one, not both: a file left beside its new name would be kept for ever
    assert sorted(p.name for p in d.iterdir()) == ["p-training-samples.2.4.0.15d54739"]


def retention(monkeypatch: pytest.MonkeyPatch, **retention_ms: int) -> None:
    """The contracts with ``retention_ms`` of the topics named (``dead_letters`` for dead-letters)."""
    real = module.contract
    changed = {name.replace("_", "-"): ms for name, ms in retention_ms.items()}
    monkeypatch.setattr(module, "contract", lambda name: dataclasses.replace(real(name), retention_ms=changed[name])
                        if name in changed else real(name))


def test_a_mark_expires_when_neither_topic_deletes(monkeypatch: pytest.MonkeyPatch) -> None:
    retention(monkeypatch, dead_letters=-1)
    assert mark_ttl_s("model-updates") == 14 * 86400  # the fixed fallback, not kept for ever
    assert mark_ttl_s("training-samples") == 14 * 86400  # its own retention


def test_retention_zero_deletes_and_a_mark_lives_an_hour_at_least(monkeypatch: pytest.MonkeyPatch) -> None:
    retention(monkeypatch, training_samples=0, retrain_events=60_000)
    assert mark_ttl_s("training-samples") == 3600.0  # deleted as soon as it can be, not the dead-letters' 14 days
    assert mark_ttl_s("retrain-events") == 3600.0
    retention(monkeypatch, training_samples=0, dead_letters=-1)
    assert mark_ttl_s("training-samples") == 3600.0
