"""PredictionPublisher.stop waits for its sink's close a bounded time: the extender's stop fits the pod's grace
period whatever the sink does."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.extender import publisher
from app.extender.metrics import ExtenderMetrics
from app.extender.predictions import Record


class HangingSink:
    async def start(self) -> None:
        pass

    async def send_many(self, records: list[Record]) -> None:
        pass

    async def close(self) -> None:
        await asyncio.Event().wait()


async def test_stop_does_not_wait_for_a_sink_that_never_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher, "CLOSE_S", 0.1)
    pub = publisher.PredictionPublisher(HangingSink(), ExtenderMetrics())
    pub.start()
    await asyncio.sleep(0.01)
    t0 = time.monotonic()
    await asyncio.wait_for(pub.stop(timeout_s=0.1), 5)
    assert time.monotonic() - t0 < 1.0
