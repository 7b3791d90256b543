"""A worker timer whose tick raises is logged and counted, and the worker goes on (Faust would crash the app)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from app.config import Settings
from app.streams.app import create_app
from app.streams.context import context_of
from app.streams.options import WorkerOptions
from app.streams.timers import timer


def test_a_failed_tick_is_counted_and_logged_and_cancellation_still_stops(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings.from_env({"RTT_METRICS_PORT": "0"})
    app = create_app(settings, id="timers", options=WorkerOptions.from_settings(settings, datadir=str(tmp_path)))
    calls: list[str] = []

    @timer(app, 1.0, "flaky")
    async def flaky() -> None:
        calls.append("tick")
        if len(calls) < 3:
            raise ConnectionError("broker away")

    @timer(app, 1.0, "stopping")
    async def stopping() -> None:
        raise asyncio.CancelledError

    async def run() -> None:
        for _ in range(3):
            await flaky()  # the first two fail: neither escapes
        with pytest.raises(asyncio.CancelledError):
            await stopping()

    with caplog.at_level(logging.WARNING, logger="app.streams.timers"):
        asyncio.run(run())
    assert calls == ["tick"] * 3
    metrics = context_of(app).metrics
    assert metrics.value("rtt_worker_timer_failures_total", timer="flaky") == 2
    assert metrics.value("rtt_worker_timer_failures_total", timer="stopping") == 0
    assert [r.getMessage() for r in caplog.records if r.name == "app.streams.timers"] == [
        "timer flaky: this tick failed (ConnectionError('broker away')); the next one runs in 1.0 s"] * 2
    assert {"flaky", "stopping"} <= {getattr(t, "__name__", "") for t in app._app_tasks}
