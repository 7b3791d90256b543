"""What bounds ``rttsched publish``'s end, and what its line of the messages not sent says: a stop (Ctrl-C, SIGTERM:
the task cancelled) gives the one more try of what was read and the producer's close :data:`~app.cli.publish.STOP_S`
in all -- the close's floor (:data:`~app.cli.publish.CLOSE_S`) inside it, not added to it; a read error (an
unreadable file) is no stop: its last try takes what a healthy but slow broker takes. Only the messages the
producer took to send (its ``send()`` returned) are said to be maybe on the topic: one still waiting for room in
the producer's buffer never left the process. Before, a read error's last try was cut at STOP_S (a broker that
answers in 2 s lost what it was sent), every message held was said to be maybe on the topic, and a stop took
STOP_S + 0.25 s."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
from test_publish_interrupted_send import Reader
from test_publish_stop_prompt import GoneBroker, ReadAheadOnStop, run_publish

from app.cli import publish


class FullBatchBroker(GoneBroker):
    """A broker just gone, as aiokafka behaves once a partition's batch is full: the producer takes the message of
    line 1 (a future that never answers); its ``send()`` of line 2 waits for room in the batch (never returns), so
    lines 2.. never leave the process. The task is cancelled (a signal) 0.1 s into that wait."""

    async def send(self, name: str, value: bytes, key: bytes | None = None) -> asyncio.Future[Any]:
        line = int(orjson.loads(value)["task_id"].split("-")[1])
        self.lines.append(line)
        loop = asyncio.get_running_loop()
        if line == 1:
            return loop.create_future()
        task = asyncio.current_task()
        assert task is not None
        loop.call_later(0.1, task.cancel)
        await asyncio.sleep(3600)  # waiting for room in the batch
        raise AssertionError("never reached")


def test_only_the_messages_the_producer_took_are_said_to_be_maybe_on_the_topic(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    producer = FullBatchBroker(cancel_at=None)
    _, ended = run_publish(monkeypatch, producer, 3)
    assert isinstance(ended, asyncio.CancelledError), ended
    assert producer.lines == [1, 2]  # line 3 never offered, line 2's send never returned
    err = capsys.readouterr().err.splitlines()
    assert err == ["publish: 3 message(s) not sent (from in.jsonl:1 on); 1 of them was sent and not acknowledged, "
                   "and may be on u-task-completions all the same (at least once): check before sending it again"], err


class SlowBroker(GoneBroker):
    """A healthy but loaded broker: it takes each message 2 s after its send (over STOP_S); its stop is at once."""

    async def send(self, name: str, value: bytes, key: bytes | None = None) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        self.lines.append(int(orjson.loads(value)["task_id"].split("-")[1]))
        answer = loop.create_future()
        loop.call_later(2.0, lambda: answer.done() or answer.set_result(None))
        return answer

    async def stop(self) -> None:
        return None


class UnreadableAfterFirst(Reader):
    """Hands over every record with more said to come, then the input turns unreadable (EIO): no stop asked."""

    def __init__(self, records: list[Any]) -> None:
        super().__init__(records)
        self.given = False

    def empty(self) -> bool:
        return False  # more to come: the records wait in pending, unsent

    async def take(self) -> list[Any]:
        if not self.given:
            self.given = True
            out = list(self.queue)
            self.queue.clear()
            return out
        raise OSError(5, "Input/output error")

    def drain(self) -> list[Any]:
        return []


def test_a_read_error_is_no_stop_its_last_try_waits_for_a_slow_broker(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    producer = SlowBroker(cancel_at=None)
    took, ended = run_publish(monkeypatch, producer, 3, UnreadableAfterFirst)
    assert isinstance(ended, OSError), ended  # the read error, said by the command as before
    assert producer.lines == [1, 2, 3]
    assert took >= 2.0, f"{took:.2f} s"  # the broker's answers were waited for
    err = capsys.readouterr().err
    assert "not sent" not in err, err  # delivered: a healthy broker got what was read


class TimedStop(ReadAheadOnStop):
    """:class:`ReadAheadOnStop`, noting the moment of the stop."""

    stopped_at = 0.0

    async def take(self) -> list[Any]:
        await asyncio.sleep(0.1)
        TimedStop.stopped_at = time.monotonic()
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(0)
        return []


def test_a_stops_last_try_and_the_close_take_stop_s_in_all(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    producer = GoneBroker(cancel_at=None)  # neither the try nor the close would end before 8 s
    started = time.monotonic()
    took, ended = run_publish(monkeypatch, producer, 2, TimedStop)
    assert isinstance(ended, asyncio.CancelledError), ended
    assert producer.lines == [1, 2] and producer.stop_cancelled
    from_stop = started + took - TimedStop.stopped_at
    assert publish.STOP_S - 0.05 <= from_stop <= publish.STOP_S + 0.1, f"{from_stop:.2f} s from the stop"
    assert "2 message(s) not sent" in capsys.readouterr().err
