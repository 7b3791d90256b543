"""The extender's background work ends when its stop cancels it, even as what it awaits is answered.

Python 3.11's ``asyncio.wait_for`` drops a cancel that comes as the awaited call returns: the view feed's look at the
broker (every ``report_s`` without records) and its task-completions positions, the rebuilder's wait between two
builds and the warm start from Redis each awaited that way, and the loop around them ran on after ``stop()``
cancelled it, with ``stop()`` waiting for it without end (SIGTERM did not stop the extender).
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition
from lost_cancel import AnsweredAsCancelled, ends_cancelled, slow_to_end, stubborn

import app.extender.feed as feed_module
import app.extender.service as service_module
from app.config import Settings
from app.extender.feed import ViewFeed
from app.extender.metrics import ExtenderMetrics
from app.extender.options import ExtenderOptions
from app.extender.service import ExtenderService
from app.scheduler.builder import SnapshotBuilder
from app.scheduler.policy import Policy


async def no_model(_update: Any) -> Any:
    raise AssertionError("no model is loaded here")


def feed() -> ViewFeed:
    return ViewFeed(Settings.from_env({}), SnapshotBuilder(), no_model, ExtenderMetrics(), rebuild=lambda force: None)


def service(**options: Any) -> ExtenderService:
    return ExtenderService(Settings(), ExtenderOptions(**options), policy=Policy(), publish=False, kafka=False,
                           redis=False)


async def test_the_feeds_broker_look_ends_when_cancelled_as_it_is_answered() -> None:
    view, look = feed(), AnsweredAsCancelled(object())
    view._consumer = SimpleNamespace(_client=SimpleNamespace(fetch_all_metadata=look))  # type: ignore[assignment]
    assert await ends_cancelled(look, view._probe()), "the probe returned: the feed's read loop ran on"
    assert look.calls == 1


async def test_the_feeds_completion_position_ends_when_cancelled_as_it_is_answered() -> None:
    view, position = feed(), AnsweredAsCancelled(7)

    async def nothing_known(_wanted: Any) -> dict[TopicPartition, int]:
        return {}

    async def seek_to_end(*_tps: Any) -> None:
        return None

    view._guard = SimpleNamespace(on_assigned=nothing_known)  # type: ignore[assignment]
    view._consumer = SimpleNamespace(seek_to_end=seek_to_end, position=position)  # type: ignore[assignment]
    tps = [TopicPartition("task-completions", p) for p in range(3)]
    assert await ends_cancelled(position, view._seek_completions(tps)), "the feed went on to read"
    assert position.calls == 1


async def test_the_rebuilder_ends_when_cancelled_as_a_model_arrives() -> None:
    ext = service(rebuild_interval_s=60.0)
    task = asyncio.get_running_loop().create_task(ext._rebuilder())
    try:
        ext._wanted.set()
        await asyncio.sleep(0.05)  # built (nothing to build), and now waits up to the interval for an urgent one
        ext._urgent.set()  # a model arrived, and the stop's cancel in the same turn
        task.cancel()
        await asyncio.wait([task], timeout=2.0)
        assert task.cancelled(), "the rebuilder ran on, waiting for the next rebuild"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_warm_start_ends_when_cancelled_as_redis_answers(monkeypatch: Any) -> None:
    warm = AnsweredAsCancelled(SimpleNamespace(usable=False))
    monkeypatch.setattr(service_module, "warm_start", warm)
    ext = service(warm_timeout_s=30.0)
    assert await ends_cancelled(warm, ext._warm_start()), "the warm start returned: the running refresher began"
    assert warm.calls == 1


async def test_stop_gives_up_on_background_work_that_does_not_end(monkeypatch: Any, caplog: Any) -> None:
    monkeypatch.setattr(service_module, "STOP_TIMEOUT_S", 0.3)
    monkeypatch.setattr(feed_module, "STOP_TIMEOUT_S", 0.3)
    ext, released = service(), asyncio.Event()
    view = feed()
    ext._tasks.append(asyncio.get_running_loop().create_task(stubborn(released), name="stuck-work"))
    view._task = asyncio.get_running_loop().create_task(stubborn(released), name="stuck-feed")
    ext.feed = view
    left = [ext._tasks[0], view._task]
    await asyncio.sleep(0)
    stopping = asyncio.ensure_future(ext.stop())
    with caplog.at_level(logging.WARNING, logger="app.extender.feed"):
        await asyncio.wait([stopping], timeout=3.0)
    stopped = stopping.done()
    released.set()  # the tasks end: a stop that still waited for them ends too
    await asyncio.wait_for(asyncio.gather(stopping, *left, return_exceptions=True), 5.0)
    said = [r.getMessage() for r in caplog.records]
    assert stopped and ext.feed is None, "stop() still waited for work it had cancelled"
    assert any(m.startswith("extender stopping: stuck-work still running") for m in said), said
    assert any(m.startswith("view feed stopping: stuck-feed still running") for m in said), said


async def test_a_stop_that_is_cancelled_is_not_swallowed() -> None:
    ext, started = service(), asyncio.Event()
    ext._tasks.append(slow_to_end(started))
    await started.wait()
    stopping = asyncio.ensure_future(ext.stop())
    await asyncio.sleep(0.05)
    stopping.cancel()  # the stop's caller gives up on it
    await asyncio.wait([stopping], timeout=2.0)
    assert stopping.cancelled(), "stop() swallowed its own cancel and went on"
