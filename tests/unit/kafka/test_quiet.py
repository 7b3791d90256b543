"""aiokafka's per-retry errors while the broker is away: one of each per period, with the count held back."""

from __future__ import annotations

import asyncio
import logging

import pytest

from app.kafka.quiet import RECURRING, _EveryFew, quiet_client_errors


@pytest.fixture
def clean_filters() -> object:
    loggers = [logging.getLogger(name) for name in RECURRING]
    saved = [list(lg.filters) for lg in loggers]
    for lg in loggers:
        lg.filters = [f for f in lg.filters if not isinstance(f, _EveryFew)]
    yield
    for lg, filters in zip(loggers, saved, strict=True):
        lg.filters = filters


def test_each_recurring_logger_keeps_one_per_period(clean_filters: object, caplog: pytest.LogCaptureFixture) -> None:
    quiet_client_errors(3600.0)
    quiet_client_errors(3600.0)  # installed once
    assert all(sum(isinstance(f, _EveryFew) for f in logging.getLogger(n).filters) == 1 for n in RECURRING)
    fetcher = logging.getLogger("aiokafka.consumer.fetcher")
    sender = logging.getLogger("aiokafka.producer.sender")
    with caplog.at_level(logging.WARNING):
        for _ in range(50):
            fetcher.error("Failed fetch messages from %s: %s", 111, "NodeNotReadyError")
            sender.warning("Got error produce response: %s", "NodeNotReadyError")
        fetcher.error("Unexpected error while fetching data: %s", "boom")  # not a per-retry message: kept
        fetcher.error("Unexpected error while fetching data: %s", "boom")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["Failed fetch messages from 111: NodeNotReadyError",
                        "Got error produce response: NodeNotReadyError",
                        "Unexpected error while fetching data: boom", "Unexpected error while fetching data: boom"]
    held = next(f for f in fetcher.filters if isinstance(f, _EveryFew)).held
    assert held == {"Failed fetch messages from": 49}


def test_the_extenders_dropped_predictions_are_said_once_per_period(clean_filters: object,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    from app.config import Settings
    from app.extender.kafka_sink import KafkaSink
    from app.extender.metrics import ExtenderMetrics

    quiet_client_errors(3600.0)
    metrics = ExtenderMetrics()
    sink = KafkaSink(Settings(), metrics)

    async def failing() -> None:  # on the event loop, as the producer's callbacks are
        for _ in range(500):  # a batch every few ms while the broker times every one out
            sink._failed(4, TimeoutError("request timed out"))

    with caplog.at_level(logging.WARNING, logger="app.extender.kafka_sink"):
        asyncio.run(failing())
    said = [r.getMessage() for r in caplog.records]
    assert said == ["rtt-predictions delivery of 4 records failed: request timed out"]
    assert metrics.dropped._value.get() == 2000  # every record still counted
