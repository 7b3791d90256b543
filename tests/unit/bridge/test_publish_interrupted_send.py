"""``rttsched publish`` interrupted (Ctrl-C, SIGTERM: its task cancelled) while it sends a batch: every line before
the one it says to resume from was sent, and the count it says not sent is every message read from that line on
-- nothing from the middle of the input is lost without a word. Before, the records already taken from the reader
and not converted yet were dropped, and the batch in flight was replaced by the read-ahead's one more try: a gap
in the topic and no "not sent" line. A reader and a producer stand-in make where the interrupt lands exact."""

from __future__ import annotations

import argparse
import asyncio
import collections
import io
import re
from typing import Any

import orjson
import pytest

from app.bridge.records import Record, read_records
from app.cli import publish
from app.config import Settings

LINES = 10_000
CHUNK = 3_000  # records each take() hands over, and at most what the read-ahead holds


def completion(n: int) -> dict[str, Any]:
    return {"task_id": f"line-{n}", "app": "upload", "node": "worker-1", "submitted_ts": 10.0 + n,
            "started_ts": 11.0 + n, "finished_ts": 13.5 + n, "rtt_ms": 3500.0, "status": "ok"}


class Reader:
    """:class:`~app.cli.publish.read_ahead.ReadAhead`'s interface: ``take()`` hands over :data:`CHUNK` records at a
    time, the read-ahead (``drain()``) holds the next :data:`CHUNK`; the lines after those are not read yet."""

    def __init__(self, records: list[Record]) -> None:
        self.queue = collections.deque(records)

    def start(self) -> None:
        pass

    def empty(self) -> bool:
        return not self.queue

    async def take(self) -> list[Record]:
        return [self.queue.popleft() for _ in range(min(CHUNK, len(self.queue)))]

    def drain(self) -> list[Record]:
        return [self.queue.popleft() for _ in range(min(CHUNK, len(self.queue)))]


class Producer:
    """Takes every message at once; the message of line ``cancel_at`` cancels the task that sends it, as a signal
    does (it lands at the task's next wait: while the batch is in flight)."""

    def __init__(self, cancel_at: int) -> None:
        self.cancel_at = cancel_at
        self.lines: set[int] = set()

    async def send(self, name: str, value: bytes, key: bytes | None = None) -> asyncio.Future[Any]:
        line = int(orjson.loads(value)["task_id"].split("-")[1])
        if line == self.cancel_at:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
        self.lines.add(line)
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def stop(self) -> None:
        pass


@pytest.mark.parametrize("cancel_at", [1, 1_500, 2_999, 3_500, 6_001])
def test_an_interrupt_during_a_send_says_every_message_not_sent_and_leaves_no_gap(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], cancel_at: int) -> None:
    import app.bridge.producer
    import app.kafka.admin

    async def reachable(*_: Any, **__: Any) -> None:
        pass

    producer = Producer(cancel_at)

    async def start_producer(*_: Any, **__: Any) -> Producer:
        return producer

    monkeypatch.setattr(app.kafka.admin, "check_reachable", reachable)
    monkeypatch.setattr(app.bridge.producer, "start_producer", start_producer)
    text = b"".join(orjson.dumps(completion(n)) + b"\n" for n in range(1, LINES + 1))
    reader = Reader(list(read_records(io.BytesIO(text))))
    args = argparse.Namespace(topic="task-completions", source="values", dry_run=False, dead_letters=False,
                              give_up_after=None)
    settings = Settings.from_env({}, topic_prefix="u-")

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(publish._publish(args, settings, reader, "in.jsonl", None))  # type: ignore[arg-type]

    err = capsys.readouterr().err
    said = re.search(r"publish: (\d+) message\(s\) not sent \(from in\.jsonl:(\d+) on\)", err)
    assert said is not None, err  # the batch in flight at least is not known to be sent
    n, first = int(said[1]), int(said[2])
    assert set(range(1, first)) <= producer.lines, (
        f"lines before {first} not sent: {sorted(set(range(1, first)) - producer.lines)[:5]}...")
    assert not producer.lines & set(range(first + n, LINES + 1)), "more messages read than said not sent"
    assert first <= cancel_at  # the line whose batch was in flight is not said to be sent
