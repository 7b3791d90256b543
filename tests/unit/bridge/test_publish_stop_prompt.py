"""``rttsched publish`` stopped (its task cancelled, as Ctrl-C and SIGTERM do) while a send waits for a broker that
just went away: it ends within :data:`~app.cli.publish.STOP_S` of the stop, not when the producer would let the batch
in flight go (the rest of its 10 s request timeout), and says what it did not send, the input line to resume from,
and that the message in flight may be on the topic all the same. Also for the one more try a stop gives what was read
when no send was under way. A producer stand-in that never answers and whose stop waits out a request timeout makes
the moment exact. Before, the stop waited for that producer: about 8 s with a real one."""

from __future__ import annotations

import argparse
import asyncio
import io
import time
from typing import Any

import orjson
import pytest
from aiokafka.errors import KafkaTimeoutError
from test_publish_interrupted_send import Reader, completion

import app.bridge.producer
import app.kafka.admin
from app.bridge.records import read_records
from app.cli import publish
from app.config import Settings

REQUEST_TIMEOUT_S = 8.0  # what is left of the producer's request timeout when the stop comes
PROMPT_S = 3.5  # STOP_S (1.5 s) and a margin for a loaded machine: far under REQUEST_TIMEOUT_S


class GoneBroker:
    """A producer whose broker just went away: a send is taken and fails when the request timeout is out; its stop
    waits that long too. ``cancel_at``: the line whose send cancels the task that sends it a moment later (a
    signal)."""

    def __init__(self, cancel_at: int | None) -> None:
        self.cancel_at = cancel_at
        self.lines: list[int] = []
        self.stop_cancelled = False

    async def send(self, name: str, value: bytes, key: bytes | None = None) -> asyncio.Future[Any]:
        line = int(orjson.loads(value)["task_id"].split("-")[1])
        self.lines.append(line)
        loop = asyncio.get_running_loop()
        if line == self.cancel_at:
            task = asyncio.current_task()
            assert task is not None
            loop.call_later(0.1, task.cancel)
        answer = loop.create_future()
        loop.call_later(REQUEST_TIMEOUT_S, lambda: answer.done() or answer.set_exception(KafkaTimeoutError()))
        return answer

    async def stop(self) -> None:
        try:
            await asyncio.sleep(REQUEST_TIMEOUT_S)
        except asyncio.CancelledError:
            self.stop_cancelled = True
            raise


def run_publish(monkeypatch: pytest.MonkeyPatch, producer: GoneBroker, lines: int,
                work: Any = None) -> tuple[float, BaseException | None]:
    async def reachable(*_: Any, **__: Any) -> None:
        pass

    async def start_producer(*_: Any, **__: Any) -> GoneBroker:
        return producer

    monkeypatch.setattr(app.kafka.admin, "check_reachable", reachable)
    monkeypatch.setattr(app.bridge.producer, "start_producer", start_producer)
    text = b"".join(orjson.dumps(completion(n)) + b"\n" for n in range(1, lines + 1))
    reader = work(list(read_records(io.BytesIO(text)))) if work else Reader(list(read_records(io.BytesIO(text))))
    args = argparse.Namespace(topic="task-completions", source="values", dry_run=False, dead_letters=False,
                              give_up_after=None)
    settings = Settings.from_env({}, topic_prefix="u-")
    started = time.monotonic()
    try:
        asyncio.run(publish._publish(args, settings, reader, "in.jsonl", None))  # type: ignore[arg-type]
    except BaseException as exc:  # noqa: BLE001 - what the stop ended it with
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


def test_a_stop_during_a_send_to_a_broker_just_gone_ends_publish_at_once(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    producer = GoneBroker(cancel_at=1)
    took, ended = run_publish(monkeypatch, producer, 3)
    assert isinstance(ended, asyncio.CancelledError), ended
    assert took < PROMPT_S, f"{took:.1f} s"  # not the producer's request timeout
    assert producer.stop_cancelled
    err = capsys.readouterr().err.splitlines()
    assert err == ["publish: 3 message(s) not sent (from in.jsonl:1 on); 3 of them were sent and not acknowledged, "
                   "and may be on u-task-completions all the same (at least once): check before sending them again"]


class ReadAheadOnStop(Reader):
    """Hands over nothing until the stop; the read-ahead then holds every record (the stop came while ``publish``
    waited for input): they get the one more try a stop gives, to the broker just gone."""

    def __init__(self, records: list[Any]) -> None:
        super().__init__(records)
        self.read: list[Any] = []

    def empty(self) -> bool:
        return True

    async def take(self) -> list[Any]:
        await asyncio.sleep(0.1)
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(0)
        return []


def test_the_one_more_try_a_stop_gives_what_was_read_is_bounded_too(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    producer = GoneBroker(cancel_at=None)
    took, ended = run_publish(monkeypatch, producer, 2, ReadAheadOnStop)
    assert isinstance(ended, asyncio.CancelledError), ended
    assert took < PROMPT_S, f"{took:.1f} s"
    assert producer.lines == [1, 2]  # they were tried
    err = capsys.readouterr().err.splitlines()
    assert err == ["publish: 2 message(s) not sent (from in.jsonl:1 on); 2 of them were sent and not acknowledged, "
                   "and may be on u-task-completions all the same (at least once): check before sending them again"]
