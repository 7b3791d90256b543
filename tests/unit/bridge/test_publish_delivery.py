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
from app.cli.publish.delivery import Delivery
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


def deliver(refuse: Callable[[str, bytes | None], BaseException | None]) -> tuple[Delivery, Producer, int]:
    settings = Settings.from_env({}, topic_prefix="u-")
    delivery = Delivery(settings, "task-completions", None, BridgeMetrics(), name="spans.json",
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


class Admin:
    """aiokafka's admin client, listing ``topics``."""

    def __init__(self, topics: list[str]) -> None:
        self.topics = topics

    async def list_topics(self) -> list[str]:
        return self.topics

    async def close(self) -> None:
        pass


def broker_away_then(monkeypatch: pytest.MonkeyPatch, topics: list[str], away: int = 2) -> list[str]:
    """The first ``away`` admin clients cannot reach Kafka (a brief outage, just after it refused a message: when
    the refusal comes, and at the next try); the next ones list ``topics``. Returns what each start met."""
    import app.kafka.admin as admin
    from app.kafka.admin import TopicError

    said: list[str] = []

    async def started_admin(settings: Settings) -> Admin:
        said.append("away" if len(said) < away else "listed")
        if said[-1] == "away":
            raise TopicError(f"cannot reach Kafka at {settings.bootstrap_servers} (RTT_KAFKA_BOOTSTRAP): "
                             "KafkaConnectionError: Unable to bootstrap")
        return Admin(topics)

    monkeypatch.setattr(admin, "started_admin", started_admin)
    return said


def deliver_unchecked(refuse: Callable[[str, bytes | None], BaseException | None]) -> tuple[Delivery, Producer, int]:
    """As :func:`deliver`, the dead-letters topic not checked at the start (no --dead-letters)."""
    settings = Settings.from_env({}, topic_prefix="u-", retry_max_backoff_s=0.1)
    delivery = Delivery(settings, "task-completions", None, BridgeMetrics(), name="spans.json")
    producer = delivery.producer = Producer(refuse)
    values = [GOOD, dict(GOOD, task_id="t-2", node="worker-2"), dict(GOOD, task_id="t-3")]
    sent = asyncio.run(delivery.send(encode_messages(settings, "task-completions", values), [4, 7, 9]))
    return delivery, producer, sent


def refuse_worker_2(name: str, key: bytes | None) -> BaseException | None:
    return TopicAuthorizationFailedError() if key == b"worker-2" and name == "u-task-completions" else None


def test_a_broker_that_cannot_say_whether_it_has_dead_letters_keeps_the_dead_letter_held_and_sends_it_again(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """The dead-letters topic exists, but Kafka could not be reached when the refusal came (a brief outage): the
    dead letter is held and sent once it answers -- kept (exit 1), not counted as not sent (exit 3) as when the
    topic is missing."""
    said = broker_away_then(monkeypatch, ["u-task-completions", "u-dead-letters"])
    delivery, producer, sent = deliver_unchecked(refuse_worker_2)
    assert said == ["away", "away", "listed"]  # asked again at each try, with a backoff
    assert sent == 2 and (delivery.kept, delivery.refused, delivery.held) == (1, 0, []), capsys.readouterr().err
    [letter] = [orjson.loads(v) for name, v, _ in producer.stored if name == "u-dead-letters"]
    assert (letter["offset"], letter["reason"], letter["key"]) == (7, "refused_by_kafka", "worker-2")
    err = capsys.readouterr().err
    assert "Kafka refused 1 message(s) for good ([Error 29] TopicAuthorizationFailedError), from spans.json:7 on: " \
           "they go to dead-letters" in err, err
    assert "not sent" not in err, err


def test_a_missing_dead_letters_topic_said_after_an_outage_is_final(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    said = broker_away_then(monkeypatch, ["u-task-completions"])
    delivery, producer, sent = deliver_unchecked(refuse_worker_2)
    assert said == ["away", "away", "listed"]
    assert sent == 2 and (delivery.kept, delivery.refused, delivery.held) == (0, 1, [])
    assert [name for name, _, _ in producer.stored] == ["u-task-completions"] * 2  # none auto-created by a write
    err = capsys.readouterr().err
    assert "not sent again, nor dead-lettered: no topic u-dead-letters on " in err, err
