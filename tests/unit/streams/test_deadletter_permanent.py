"""A dead letter stays small, and one the broker refuses for good is dropped (logged, counted), never retried for
ever: a checkpoint waits for the intake's dead letters before it writes the read positions past them, and an
intake not started waits for them itself, so one that can never be stored would stall it."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError
from faust.exceptions import ProducerSendError
from intake_standins import Producer

from app.clock import ManualClock
from app.config import Settings
from app.contracts import decode, encode
from app.contracts.dead import MAX_KEY_CHARS, MAX_RAW_BYTES, dead_letter_record
from app.errors import ContractError
from app.kafka.batches import BatchSender
from app.streams.deadletter import DeadLetters
from app.streams.intake import PartitionIntake


@dataclasses.dataclass
class Msg:
    value: bytes | None
    key: bytes | None
    partition: int = 0
    offset: int = 5
    topic: str = "u-node-metrics"


class Broker:
    """Takes what ``refuse`` says nothing of; ``refuse(offset, try)``: an error to fail the delivery with, or to
    raise from ``send`` itself when ``sync`` (as Faust does when the producer refuses a record at once)."""

    def __init__(self, refuse: Any, sync: bool = False) -> None:
        self.refuse, self.sync = refuse, sync
        self.tries: dict[int, int] = {}
        self.stored: list[int] = []

    async def send(self, key: bytes, value: bytes) -> asyncio.Future[None]:
        offset = orjson.loads(value)["offset"]
        n = self.tries[offset] = self.tries.get(offset, 0) + 1
        exc = self.refuse(offset, n)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if exc is None:
            self.stored.append(offset)
            fut.set_result(None)
        elif self.sync:
            raise ProducerSendError(f"Error while sending: {exc!r}") from exc
        else:
            fut.set_exception(exc)
        return fut


def dead_letters(tmp_path: Path, broker: Broker) -> DeadLetters:
    from app.streams.app import create_app
    from app.streams.options import WorkerOptions

    settings = Settings.from_env({"RTT_METRICS_PORT": "0", "RTT_RETRY_MAX_BACKOFF_S": "0.01"})
    options = WorkerOptions.from_settings(settings, datadir=str(tmp_path))
    app = create_app(settings, id="dead-permanent", options=options)
    dead = DeadLetters(app, settings)
    dead.topic = broker  # type: ignore[assignment]
    return dead


def bad(*offsets: int, key: bytes = b"n1") -> list[tuple[Any, str, ContractError]]:
    return [(Msg(b"{", key, offset=o), "node-metrics", ContractError("invalid_json", "x")) for o in offsets]


@pytest.mark.parametrize("sync", [False, True], ids=["delivery-fails", "send-raises"])
async def test_a_dead_letter_refused_for_good_is_dropped_once_logged_and_counted(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, sync: bool) -> None:
    broker = Broker(lambda offset, n: MessageSizeTooLargeError("too large") if offset == 2 else None, sync=sync)
    dead = dead_letters(tmp_path, broker)
    with caplog.at_level(logging.WARNING, logger="app.streams.deadletter"):
        await asyncio.wait_for(dead.send_all(bad(1, 2, 3)), 5.0)  # used to send offset 2 again for ever
    assert broker.tries == {1: 1, 2: 1, 3: 1} and broker.stored == [1, 3]
    assert dead.sent == 2
    m = dead.metrics
    assert m.value("rtt_worker_dead_letters_total", topic="node-metrics", reason="invalid_json") == 2
    assert m.value("rtt_worker_messages_out_total", topic="dead-letters") == 2
    assert m.value("rtt_worker_send_failures_total", topic="dead-letters", outcome="dropped") == 1
    assert m.value("rtt_worker_send_failures_total", topic="dead-letters", outcome="retried") == 0
    [line] = [r for r in caplog.records if r.name == "app.streams.deadletter"]
    assert line.levelno == logging.ERROR
    assert "u-node-metrics[0]@2" in line.getMessage() and "MessageSizeTooLarge" in line.getMessage()


@pytest.mark.parametrize("sync", [False, True], ids=["delivery-fails", "send-raises"])
async def test_a_dead_letter_refused_for_a_while_is_sent_again_until_stored(tmp_path: Path, sync: bool) -> None:
    broker = Broker(lambda offset, n: KafkaTimeoutError() if offset == 2 and n <= 2 else None, sync=sync)
    dead = dead_letters(tmp_path, broker)
    await asyncio.wait_for(dead.send_all(bad(1, 2, 3)), 5.0)
    assert broker.tries == {1: 1, 2: 3, 3: 1} and broker.stored == [1, 3, 2] and dead.sent == 3
    m = dead.metrics
    assert m.value("rtt_worker_send_failures_total", topic="dead-letters", outcome="retried") == 2
    assert m.value("rtt_worker_send_failures_total", topic="dead-letters", outcome="dropped") == 0


def test_a_huge_key_that_is_not_utf8_is_cut_and_the_dead_letter_says_so() -> None:
    """Each byte that is not UTF-8 used to become a three-byte replacement character: a 1 MB key made a 3 MB dead
    letter, which no broker takes."""
    key = b"\xff" * 1_000_000
    rec = dead_letter_record(Msg(b"x" * 900_000, key), "node-metrics", ContractError("key_mismatch", "k"), 1.0)
    value = encode("dead-letters", rec)
    assert decode("dead-letters", value) == rec
    assert len(value) < 2 * MAX_RAW_BYTES  # the raw payload's base64 and little else
    assert rec["key"] == "\ufffd" * MAX_KEY_CHARS and len(rec["key"].encode()) <= 4 * MAX_KEY_CHARS
    assert rec["error"].startswith("key_mismatch: k")
    assert f"key cut to its first {MAX_KEY_CHARS} characters (of 1,000,000 bytes)" in rec["error"]
    assert f"raw cut to its first {MAX_RAW_BYTES:,} bytes (of 900,000)" in rec["error"]
    assert len(base64.b64decode(rec["raw"])) == MAX_RAW_BYTES


def test_a_key_within_the_bound_is_kept_whole_and_nothing_is_said() -> None:
    name = "node-" + "é" * (MAX_KEY_CHARS - 5)  # two bytes each: more bytes than characters, not cut
    rec = dead_letter_record(Msg(b"{", name.encode()), "node-metrics", ContractError("invalid_json", "x"), 1.0)
    assert rec["key"] == name and rec["error"] == "invalid_json: x"
    rec = dead_letter_record(Msg(b"{", name.encode() + b"!"), "node-metrics", ContractError("invalid_json", "x"),
                             1.0)
    assert rec["key"] == name and "key cut" in rec["error"]


async def test_a_dead_letter_on_the_intake_s_sender_refused_for_good_is_dropped_logged_once_and_counted(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An intake's dead letters go out on its sender: one refused for good leaves it (the next checkpoint is not
    held up by it), never counted as stored, and the dead letters after it are counted under their own reason."""
    broker = Producer(MessageSizeTooLargeError("too large"))
    dead = dead_letters(tmp_path, Broker(lambda offset, n: None))
    settings = Settings.from_env({"RTT_METRICS_PORT": "0"})
    topic = settings.topic("node-metrics")
    it = PartitionIntake(settings, {"node-metrics": lambda value, p: None}, dead, clock=ManualClock(1.0),
                         metrics=dead.metrics)
    it.assign({0}, {})
    sender = it.sender = BatchSender(broker, on_delivered=it._delivered, on_failed=it._failed)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        await it.process({TopicPartition(topic, 0): [Msg(b"{", b"n1", offset=1, topic=topic)]})
        with pytest.raises(MessageSizeTooLargeError):
            await sender.flush()  # the checkpoint that waited for it fails once
        await it.process({TopicPartition(topic, 0): [Msg(b"{}", b"n1", offset=2, topic=topic)]})
        await sender.flush()  # the next one is not held up
    assert [decode("dead-letters", v)["offset"] for _, _, v in broker.log] == [2] and len(sender) == 0
    m = dead.metrics
    assert m.value("rtt_worker_send_failures_total", topic="dead-letters", outcome="dropped") == 1
    assert m.value("rtt_worker_dead_letters_total", topic="node-metrics", reason="invalid_json") == 0
    assert m.value("rtt_worker_dead_letters_total", topic="node-metrics", reason="schema") == 1
    assert dead.sent == 1
    [line] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "dead-letters" in line.getMessage() and "MessageSizeTooLarge" in line.getMessage()
