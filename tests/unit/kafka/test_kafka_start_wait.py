"""A long-running service started before its broker (or before ``rttsched topics create``) waits for it
(:func:`app.kafka.admin.wait_reachable`): tries 1 s apart doubling to 10 s, one WARNING when it begins, a reminder
at most every 30 s (at once when the reason changes), one INFO with how long it waited, a bound
(``RTT_KAFKA_START_WAIT_S``) past which the last try's one-line error stands, and a stop (cancellation) at once.
Before, the worker, trainer and bridge exited at once with code 2 and left the restart to their supervisor.
The broker here is a scripted check on a fake clock; the real one: tests/integration/test_kafka_start_wait_live.py."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence

import pytest

from app.config import Settings
from app.errors import ConfigError
from app.kafka.admin import TopicError, wait_reachable
from app.retry import Backoff

UNREACHABLE = "cannot reach Kafka at 127.0.0.1:9 (RTT_KAFKA_BOOTSTRAP): KafkaConnectionError: refused"
NO_TOPICS = "no topic node-metrics on 127.0.0.1:9 (RTT_TOPIC_PREFIX ''): create them with `rttsched topics create`"


class Broker:
    """A check failing with ``reasons`` in turn (None: it passes), on a clock only the waits move."""

    def __init__(self, reasons: Sequence[str | None]) -> None:
        self.reasons = list(reasons)
        self.now = 0.0
        self.tries: list[float] = []
        self.asked: list[Sequence[str]] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds

    async def check(self, settings: Settings, topics: Sequence[str]) -> None:
        self.tries.append(self.now)
        self.asked.append(topics)
        reason = self.reasons.pop(0) if self.reasons else None
        if reason is not None:
            raise TopicError(reason)


def wait(broker: Broker, settings: Settings | None = None, **kw: object) -> float:
    return asyncio.run(wait_reachable(settings or Settings(kafka_bootstrap="127.0.0.1:9"), ("node-metrics",),
                                      service="worker", check=broker.check, clock=broker.clock, sleep=broker.sleep,
                                      backoff=Backoff(first_s=1.0, max_s=10.0, jitter=0.0), **kw))  # type: ignore[arg-type]


def said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "app.kafka.admin"]


def test_a_broker_that_answers_at_once_is_not_waited_for_and_nothing_is_said(caplog):
    caplog.set_level(logging.INFO, logger="app.kafka.admin")
    broker = Broker([])
    assert wait(broker) == 0.0
    assert broker.tries == [0.0] and broker.asked == [("node-metrics",)]
    assert said(caplog) == []


def test_the_tries_are_1_s_apart_doubling_to_10_s(caplog):
    caplog.set_level(logging.INFO, logger="app.kafka.admin")
    broker = Broker([UNREACHABLE] * 7)
    assert wait(broker) == 1 + 2 + 4 + 8 + 10 + 10 + 10
    assert broker.tries == [0, 1, 3, 7, 15, 25, 35, 45]


def test_one_warning_when_it_begins_reminders_at_most_every_30_s_and_one_info_when_it_answers(caplog):
    caplog.set_level(logging.INFO, logger="app.kafka.admin")
    broker = Broker([UNREACHABLE] * 12)  # tries at 0, 1, 3, 7, 15, 25, 35, 45, 55, 65, 75, 85; answers at 95
    assert wait(broker) == 95
    lines = said(caplog)
    assert [level for level, _ in lines] == ["WARNING", "WARNING", "WARNING", "INFO"], lines
    assert lines[0][1] == (f"worker: waiting for Kafka: {UNREACHABLE}; trying again every 1-10 s until it answers "
                           "(RTT_KAFKA_START_WAIT_S=0)")
    assert lines[1][1] == f"worker: still waiting for Kafka at 127.0.0.1:9 after 35 s: {UNREACHABLE}"
    assert lines[2][1] == f"worker: still waiting for Kafka at 127.0.0.1:9 after 65 s: {UNREACHABLE}"
    assert lines[3][1] == "worker: Kafka at 127.0.0.1:9 answered after 95.0 s of waiting"


def test_the_broker_up_with_its_topics_missing_is_said_at_once_naming_topics_create(caplog):
    caplog.set_level(logging.INFO, logger="app.kafka.admin")
    broker = Broker([UNREACHABLE, UNREACHABLE, NO_TOPICS, NO_TOPICS])
    assert wait(broker) == 1 + 2 + 4 + 8
    lines = said(caplog)
    assert [level for level, _ in lines] == ["WARNING", "WARNING", "INFO"], lines
    assert lines[1][1] == f"worker: still waiting for Kafka at 127.0.0.1:9 after 3 s: {NO_TOPICS}"
    assert "`rttsched topics create`" in lines[1][1]


def test_waiting_is_told_the_reason_of_each_failed_try_and_none_once_it_answers():
    told: list[str | None] = []
    wait(Broker([UNREACHABLE, NO_TOPICS]), waiting=told.append)
    assert told == [UNREACHABLE, NO_TOPICS, None]


def test_a_bound_gives_up_with_the_last_reason_in_one_line(caplog):
    caplog.set_level(logging.INFO, logger="app.kafka.admin")
    broker = Broker([UNREACHABLE] * 100)
    with pytest.raises(TopicError) as exc:
        wait(broker, Settings(kafka_bootstrap="127.0.0.1:9", kafka_start_wait_s=20.0))
    assert str(exc.value) == f"{UNREACHABLE} (gave up after 20 s: RTT_KAFKA_START_WAIT_S=20)"
    assert broker.tries == [0, 1, 3, 7, 15, 20]  # the last wait cut to the bound
    assert said(caplog)[0][1].endswith("trying again every 1-10 s for up to 20 s (RTT_KAFKA_START_WAIT_S)")


def test_a_broker_that_answers_within_the_bound_is_waited_for():
    assert wait(Broker([NO_TOPICS] * 3), Settings(kafka_bootstrap="127.0.0.1:9", kafka_start_wait_s=20.0)) == 7


def test_a_stop_during_the_wait_ends_it_at_once():
    async def scenario() -> tuple[bool, float]:
        broker = Broker([UNREACHABLE] * 1000)
        task = asyncio.ensure_future(wait_reachable(Settings(kafka_bootstrap="127.0.0.1:9"), (), service="trainer",
                                                    check=broker.check,
                                                    backoff=Backoff(first_s=1.0, max_s=10.0, jitter=0.0)))
        await asyncio.sleep(0.05)  # in its first 1 s pause
        loop = asyncio.get_running_loop()
        started = loop.time()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True, loop.time() - started
        return False, loop.time() - started

    cancelled, took = asyncio.run(scenario())
    assert cancelled and took < 0.5


def test_the_default_back_off_is_1_s_doubling_to_10_s_with_jitter():
    from app.kafka import admin

    assert (admin.START_FIRST_TRY_S, admin.START_LAST_TRY_S, admin.START_REMIND_S) == (1.0, 10.0, 30.0)
    b = Backoff(first_s=admin.START_FIRST_TRY_S, max_s=admin.START_LAST_TRY_S, rng=random.Random(1))
    assert all(0.8 * want <= b.next() <= 1.2 * want for want in (1, 2, 4, 8, 10, 10))


@pytest.mark.parametrize(("raw", "line"), [("-1", "RTT_KAFKA_START_WAIT_S: must be >= 0 (got -1.0)"),
                                           ("inf", "RTT_KAFKA_START_WAIT_S: must be finite (got inf)"),
                                           ("soon", "RTT_KAFKA_START_WAIT_S: must be a number (got 'soon')")])
def test_a_bad_bound_is_refused_naming_its_variable(raw, line):
    with pytest.raises(ConfigError) as exc:
        Settings.from_env({"RTT_KAFKA_START_WAIT_S": raw})
    assert str(exc.value) == line


def test_the_bound_defaults_to_waiting_until_the_broker_answers():
    assert Settings.from_env({}).kafka_start_wait_s == 0.0
    assert Settings.from_env({"RTT_KAFKA_START_WAIT_S": "120"}).kafka_start_wait_s == 120.0
