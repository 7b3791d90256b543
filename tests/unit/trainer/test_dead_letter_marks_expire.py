"""Dead-letter marks in ``{RTT_MODELS_DIR}/dead-letters`` expire as Redis's do: a mark past its expiry is taken for
absent (the message is dead-lettered again) and removed, and the directory is swept of expired marks at the first
lookup and every ``sweep_every`` marks stored, so it does not grow without bound. Real files, a manual clock; the
Redis marks compared are a real redis-server's."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka.structs import ConsumerRecord

from app.clock import ManualClock
from app.config import Settings
from app.errors import ContractError
from app.trainer import dead_letters as module
from app.trainer.dead_letters import (
    UNBOUNDED_MARK_TTL_S,
    DirectoryMarks,
    Marks,
    RedisMarks,
    TrainerDeadLetters,
    mark_ttl_s,
    open_marks,
)
from app.trainer.metrics import TrainerMetrics


class Producer:
    """Takes every send in memory."""

    def __init__(self) -> None:
        self.offsets: list[int] = []

    async def send(self, topic: str, value: bytes, key: bytes) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        self.offsets.append(len(self.offsets))
        return fut


def bad(offset: int) -> tuple[ConsumerRecord, ContractError]:
    rec = ConsumerRecord("p-training-samples", 2, offset, 1_700_000_000_000, 0, b"gCTF:gpu", b"{", None, 8, 1, ())
    return rec, ContractError("invalid_json", "not JSON")


def names(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


async def test_a_directory_mark_expires_with_the_ttl_a_redis_one_gets(tmp_path: Path) -> None:
    clock = ManualClock(1_800_000_000.0)
    settings = Settings.from_env({}, models_dir=str(tmp_path), topic_prefix="p-")
    producer = Producer()
    d = TrainerDeadLetters(settings, TrainerMetrics(), clock, producer=producer)  # type: ignore[arg-type]
    ttl = mark_ttl_s("training-samples")
    assert await d.send("training-samples", [bad(1)]) == 1
    clock.advance(ttl - 1.0)
    assert await d.send("training-samples", [bad(1)]) == 0  # still marked
    clock.advance(1.0)
    # expired: the message is dead-lettered again (its first dead letter is gone by now), and marked again
    assert await d.send("training-samples", [bad(1)]) == 1
    assert await d.send("training-samples", [bad(1)]) == 0
    mark = tmp_path / "dead-letters" / "p-training-samples.2.1.1700000000000.15d54739"
    assert float(mark.read_text()) == clock.now() + ttl


async def test_expired_marks_are_swept_at_start_and_every_n_marks_stored(tmp_path: Path) -> None:
    clock = ManualClock(1_800_000_000.0)
    path = tmp_path / "dead-letters"
    first = DirectoryMarks(path, clock, sweep_every=3)
    for i in range(3):
        await first.add(f"t.0.{i}.-1.00000000", ttl_s=100.0)
    await first.add("t.0.9.-1.00000000", ttl_s=1000.0)
    clock.advance(100.0)
    # a restarted trainer: its first lookup sweeps the three expired, whatever it looks up
    restarted = DirectoryMarks(path, clock, sweep_every=3)
    assert not await restarted.has("t.1.0.-1.00000000")
    assert names(path) == ["t.0.9.-1.00000000"]
    for i in range(2):
        await restarted.add(f"t.2.{i}.-1.00000000", ttl_s=10.0)
    clock.advance(1000.0)  # all four expired, none looked up
    assert len(names(path)) == 3  # no sweep yet: two stored since the first
    await restarted.add("t.3.0.-1.00000000", ttl_s=10.0)  # the third: a sweep
    assert names(path) == ["t.3.0.-1.00000000"]


async def test_a_mark_of_the_earlier_release_expires_as_long_after_it_was_written(tmp_path: Path) -> None:
    clock = ManualClock(1_800_000_000.0)
    path = tmp_path / "dead-letters"
    path.mkdir()
    for name, written in [("t.0.1.-1.00000000", clock.now() - UNBOUNDED_MARK_TTL_S),
                          ("t.0.2.-1.00000000", clock.now() - UNBOUNDED_MARK_TTL_S + 60.0)]:
        (path / name).touch()  # empty: no expiry in it
        os.utime(path / name, (written, written))
    marks = DirectoryMarks(path, clock)
    assert not await marks.has("t.0.1.-1.00000000")
    assert await marks.has("t.0.2.-1.00000000")
    assert names(path) == ["t.0.2.-1.00000000"]
    clock.advance(60.0)
    assert not await marks.has("t.0.2.-1.00000000")
    assert names(path) == []


async def test_a_renamed_mark_of_the_earlier_release_gets_its_expiry(tmp_path: Path) -> None:
    clock = ManualClock(1_800_000_000.0)
    path = tmp_path / "dead-letters"
    path.mkdir()
    (path / "t.0.1.00000000").touch()
    marks = DirectoryMarks(path, clock)
    await marks.replace("t.0.1.00000000", "t.0.1.5.00000000", ttl_s=3600.0)
    assert names(path) == ["t.0.1.5.00000000"]
    assert float((path / "t.0.1.5.00000000").read_text()) == clock.now() + 3600.0


async def test_a_mark_that_cannot_be_read_or_removed_does_not_stop_the_trainer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock(1_800_000_000.0)
    settings = Settings.from_env({}, models_dir=str(tmp_path), topic_prefix="p-")
    producer = Producer()
    d = TrainerDeadLetters(settings, TrainerMetrics(), clock, producer=producer)  # type: ignore[arg-type]
    path = tmp_path / "dead-letters"
    (path / "p-training-samples.2.1.1700000000000.15d54739").mkdir(parents=True)  # a mark no file can be read of
    assert await d.send("training-samples", [bad(1), bad(2)]) == 2  # the unreadable one dead-lettered anyway
    assert await d.send("training-samples", [bad(2)]) == 0
    clock.advance(mark_ttl_s("training-samples"))

    def refused(p: Any, *args: Any, **kwargs: Any) -> None:
        raise PermissionError(13, "Permission denied", str(p))

    monkeypatch.setattr(os, "unlink", refused)
    with caplog.at_level(logging.WARNING, logger=module.__name__):
        assert await d.send("training-samples", [bad(2)]) == 1  # expired, left: taken for absent
        assert await DirectoryMarks(path, clock).sweep() == 0  # neither the unreadable one nor the one left
    assert any("not removed" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    clock.advance(mark_ttl_s("training-samples"))
    assert await DirectoryMarks(path, clock).sweep() == 1
    assert names(path) == ["p-training-samples.2.1.1700000000000.15d54739"]  # the directory in the way, left


async def test_a_mark_stored_again_after_it_was_read_expired_is_not_removed(tmp_path: Path) -> None:
    clock = ManualClock(1_800_000_000.0)
    path = tmp_path / "dead-letters"
    one, other = DirectoryMarks(path, clock), DirectoryMarks(path, clock)  # two trainers sharing the directory
    await one.add("t.0.1.-1.00000000", ttl_s=10.0)
    clock.advance(10.0)
    read = DirectoryMarks._expiry(path / "t.0.1.-1.00000000")  # the one reads it expired ...
    assert read is not None and read <= clock.now()
    await other.add("t.0.1.-1.00000000", ttl_s=10.0)  # ... the other stores it again ...
    assert DirectoryMarks._remove(path / "t.0.1.-1.00000000", clock.now()) == 0  # ... the one leaves it
    assert await one.has("t.0.1.-1.00000000")


async def test_a_write_cut_short_is_swept_an_hour_later(tmp_path: Path) -> None:
    clock = ManualClock(1_800_000_000.0)
    path = tmp_path / "dead-letters"
    path.mkdir()
    left = path / "t.0.1.-1.00000000.0123abcd.part"
    left.write_text("18")
    os.utime(left, (clock.now(), clock.now()))
    marks = DirectoryMarks(path, clock)
    assert await marks.sweep() == 0
    clock.advance(3600.0)
    assert await marks.sweep() == 1 and names(path) == []


@pytest.fixture(params=["redis", "directory"])
async def store(request: pytest.FixtureRequest, tmp_path: Path,
                ) -> AsyncIterator[tuple[Marks, Callable[[float], Any]]]:
    """Marks of each kind, and how time passes for them (Redis expires by its own clock: a real wait)."""
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        redis = RedisMarks(Settings(redis_url=url, topic_prefix=f"t{uuid.uuid4().hex[:10]}-"))
        assert isinstance(open_marks(Settings(redis_url=url)), RedisMarks)
        yield redis, asyncio.sleep
        await redis.close()
        return
    clock = ManualClock(1_800_000_000.0)

    async def advance(seconds: float) -> None:
        clock.advance(seconds)

    directory = open_marks(Settings.from_env({}, models_dir=str(tmp_path)), clock)
    assert isinstance(directory, DirectoryMarks)
    yield directory, advance


async def test_both_stores_keep_a_mark_for_its_ttl_and_no_longer(store: tuple[Marks, Callable[[float], Any]]) -> None:
    # Redis's clock runs on: each mark still there is looked at well within its TTL (0.75 s to spare at least on a
    # loaded machine), each gone one past it
    marks, wait = store
    await marks.add("t.0.1.5.00000000", ttl_s=1.0)
    await marks.add("t.0.2.00000000", ttl_s=1.0)
    await marks.replace("t.0.2.00000000", "t.0.2.5.00000000", ttl_s=2.0)
    assert [await marks.has(n) for n in ("t.0.1.5.00000000", "t.0.2.00000000", "t.0.2.5.00000000")] == [
        True, False, True]
    await wait(1.25)
    assert [await marks.has(n) for n in ("t.0.1.5.00000000", "t.0.2.5.00000000")] == [False, True]
    await wait(1.0)
    assert not await marks.has("t.0.2.5.00000000")


@pytest.mark.parametrize("length", [200, 249])  # past the file names the write of a mark beside it took; Kafka's most
async def test_a_mark_of_a_topic_with_a_long_name_is_stored(tmp_path: Path, length: int) -> None:
    clock = ManualClock(1_800_000_000.0)
    settings = Settings.from_env({}, models_dir=str(tmp_path), topic_prefix="p-")
    d = TrainerDeadLetters(settings, TrainerMetrics(), clock, producer=Producer())  # type: ignore[arg-type]
    topic = "p" * (length - len("-training-samples")) + "-training-samples"
    rec, exc = bad(1)
    long, other = dataclasses.replace(rec, topic=topic), dataclasses.replace(rec, topic=topic, offset=2)
    assert await d.send("training-samples", [(long, exc), (other, exc)]) == 2
    assert await d.send("training-samples", [(long, exc), (other, exc)]) == 0  # each marked, told apart
    files = names(tmp_path / "dead-letters")
    assert len(files) == 2 and all(len(f) <= 255 for f in files)
    clock.advance(mark_ttl_s("training-samples"))
    assert await d.send("training-samples", [(long, exc)]) == 1  # and expires as any other


async def test_a_sweep_says_once_how_many_expired_marks_it_could_not_remove(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock(1_800_000_000.0)
    path = tmp_path / "dead-letters"
    marks = DirectoryMarks(path, clock)
    for i in range(5):
        await marks.add(f"t.0.{i}.-1.00000000", ttl_s=10.0)
    clock.advance(10.0)

    def read_only(p: Any, *args: Any, **kwargs: Any) -> None:
        raise OSError(30, "Read-only file system", str(p))

    monkeypatch.setattr(os, "unlink", read_only)  # a directory mounted read-only
    with caplog.at_level(logging.WARNING, logger=module.__name__):
        assert await marks.sweep() == 0
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and lines[0].startswith("5 expired dead-letter mark(s)") and "Read-only" in lines[0]
    assert len(names(path)) == 5
    assert not await marks.has("t.0.0.-1.00000000")  # each still taken for absent
