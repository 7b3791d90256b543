"""``rttsched publish``'s delivery when the broker answers a message with an error sending again cannot cure (a
topic it may not write): the message goes to dead-letters with the reason ``refused_by_kafka`` and its input line;
a dead letter refused too is counted as not sent. A producer stand-in settles each send at once."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from aiokafka.errors import TopicAuthorizationFailedError

from app.bridge.metrics import BridgeMetrics
from app.bridge.producer import encode_messages
from app.cli.publish import _Delivery
from app.config import Settings

GOOD = {"task_id": "t-1", "app": "gCTF", "node": "worker-1", "submitted_ts": 1.0, "started_ts": 2.0,
        "finished_ts": 5.0, "rtt_ms": 4000.0, "status": "ok"}


class Producer:
    """aiokafka's ``send``: a future settled at once, failed with what ``refuse(topic, key)`` returns, if anything."""

    def __init__(self, refuse: Callable[[str, bytes | None], BaseException | None]) -> None:
        self.refuse = refuse
        self.stored: list[tuple[str, bytes, bytes | None]] = []

    async def send(self, name: str, value: bytes, key: bytes | None = None) -> asyncio.Future[Any]:
        done = asyncio.get_running_loop().create_future()
        error = self.refuse(name, key)
        if error is not None:
            done.set_exception(error)
        else:
            self.stored.append((name, value, key))
            done.set_result(None)
        return done

    async def stop(self) -> None:
        pass


def deliver(refuse: Callable[[str, bytes | None], BaseException | None]) -> tuple[_Delivery, Producer, int]:
    settings = Settings.from_env({}, topic_prefix="u-")
    delivery = _Delivery(settings, "task-completions", None, BridgeMetrics(), name="spans.json",
                         letters_checked=True)
    producer = delivery.producer = Producer(refuse)
    values = [GOOD, dict(GOOD, task_id="t-2", node="worker-2"), dict(GOOD, task_id="t-3")]
    sent = asyncio.run(delivery.send(encode_messages(settings, "task-completions", values), [4, 7, 9]))
    return delivery, producer, sent


def test_a_message_the_broker_refuses_for_good_is_dead_lettered_with_its_line(capsys: pytest.CaptureFixture[str]):
    def refuse(name: str, key: bytes | None) -> BaseException | None:
        return TopicAuthorizationFailedError() if key == b"worker-2" and name == "u-task-completions" else None

    delivery, producer, sent = deliver(refuse)
    assert sent == 2 and (delivery.kept, delivery.refused, delivery.held) == (1, 0, [])
    [letter] = [orjson.loads(v) for name, v, _ in producer.stored if name == "u-dead-letters"]
    assert (letter["topic"], letter["offset"], letter["reason"], letter["key"]) == (
        "u-task-completions", 7, "refused_by_kafka", "worker-2")
    assert orjson.loads(base64.b64decode(letter["raw"]))["task_id"] == "t-2"
    assert letter["error"] == "refused_by_kafka: refused for good ([Error 29] TopicAuthorizationFailedError)"
    assert capsys.readouterr().err == (
        "publish: error: Kafka refused 1 message(s) for good ([Error 29] TopicAuthorizationFailedError), from "
        "spans.json:7 on: they go to dead-letters (reason refused_by_kafka)\n")


def test_a_dead_letter_refused_for_good_too_is_counted_not_sent(capsys: pytest.CaptureFixture[str]):
    def refuse(name: str, key: bytes | None) -> BaseException | None:
        return TopicAuthorizationFailedError() if key == b"worker-2" or name == "u-dead-letters" else None

    delivery, producer, sent = deliver(refuse)
    assert sent == 2 and (delivery.kept, delivery.refused, delivery.held) == (0, 1, [])
    assert [key for _, _, key in producer.stored] == [b"worker-1", b"worker-1"]
    err = capsys.readouterr().err
    assert "Kafka refused 1 dead letter(s) for good ([Error 29] TopicAuthorizationFailedError), from spans.json:7 " \
           "on; not sent again" in err, err
