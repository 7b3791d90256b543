"""A send of Faust's that nobody awaits and the broker refused: counted and said once, no asyncio traceback."""

from __future__ import annotations

import asyncio
import gc
import logging

import faust
import pytest
from aiokafka.errors import UnknownError
from faust.types.tuples import FutureMessage, PendingMessage
from prometheus_client import CollectorRegistry, Counter

from app.streams.unretrieved import install


def _refused(app: faust.App, topic: str) -> None:
    """A changelog-like send to ``topic`` that the broker refused, dropped by its sender unread."""
    pending = PendingMessage(app.topic(topic), b"k", b"v", 0, None, None, None, None, None)
    future = FutureMessage(pending)
    future.set_exception(UnknownError())


def test_refused_sends_nobody_waited_for_are_counted_and_said_without_a_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    app = faust.App("unretrieved-test", broker="kafka://127.0.0.1:1", autodiscover=False)
    failures = Counter("sends_failed", "x", ["topic", "outcome"], registry=CollectorRegistry())
    others: list[str] = []

    async def run() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda loop, context: others.append(context["message"]))
        install(loop, lambda topic: failures.labels(topic, "dropped"))
        for _ in range(3):
            _refused(app, "w-node-window-changelog")
        plain: asyncio.Future[None] = loop.create_future()  # not Faust's: the handler that was there hears it
        plain.set_exception(RuntimeError("boom"))
        del plain
        gc.collect()
        await asyncio.sleep(0)

    with caplog.at_level(logging.WARNING):
        asyncio.run(run())
    assert failures.labels("w-node-window-changelog", "dropped")._value.get() == 3
    said = [r for r in caplog.records if "not delivered" in r.getMessage()]
    assert len(said) == 3 and all(r.exc_info is None and r.levelno == logging.WARNING for r in said)
    assert "w-node-window-changelog" in said[0].getMessage() and "UnknownError" in said[0].getMessage()
    assert not any("never retrieved" in r.getMessage() for r in caplog.records)
    assert others == ["Future exception was never retrieved"]
