"""Ctrl-C stops the bridge even when it comes as the first read of the running-pods view is answered.

With ``REDIS_URL`` set, the bridge reads the running-pods view once before its first round. That read was bounded by
``asyncio.wait_for``, which in Python 3.11 drops a cancel that comes in the turn of the event loop its answer lands
in: the bridge ran on, scraping, after the Ctrl-C (``asyncio.run`` turns it into a cancel) that should have stopped
it. A cancel there also left the bridge's Redis client open: that read came before the clean-up's ``try``.
"""

from __future__ import annotations

from typing import Any

import pytest
from lost_cancel import AnsweredAsCancelled, ends_cancelled

import app.bridge.scraper as scraper
from app.bridge.running import RunningPods
from app.config import Settings


async def test_a_cancel_as_the_first_view_is_read_stops_the_bridge(monkeypatch: pytest.MonkeyPatch) -> None:
    answered = AnsweredAsCancelled(answer=True)
    monkeypatch.setattr(RunningPods, "refresh", answered)
    closed: list[Any] = []
    made = scraper.settings_redis

    def settings_redis(settings: Settings) -> Any:
        client = made(settings)
        real = client.aclose

        async def aclose() -> None:
            closed.append(client)
            await real()

        client.aclose = aclose
        return client

    monkeypatch.setattr(scraper, "settings_redis", settings_redis)
    settings = Settings(redis_url="redis://127.0.0.1:9/0", scrape_interval_s=0.05, scrape_timeout_s=5.0)
    bridge = scraper.run_bridge(settings, [], publish=False)
    assert await ends_cancelled(answered, bridge), "the bridge ran on after the cancel that came with the view"
    assert answered.calls == 1 and len(closed) == 1
