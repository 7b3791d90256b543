"""A stop of the extender that is itself cancelled while it waits for its background work still closes what the
service holds: the view feed's consumer, the publisher and Redis; then the cancel goes on to its caller.

The stop waits (``STOP_TIMEOUT_S`` at most) for the tasks it cancelled; a cancel of the stop in that wait used to end
it there, leaving the Kafka consumer, the publisher's queued predictions and the Redis connection unclosed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from lost_cancel import slow_to_end

from app.config import Settings
from app.extender.feed import ViewFeed
from app.extender.metrics import ExtenderMetrics
from app.extender.options import ExtenderOptions
from app.extender.service import ExtenderService
from app.scheduler.builder import SnapshotBuilder
from app.scheduler.policy import Policy


class Closing:
    """Stands for a consumer, a publisher or a Redis client: counts its closes."""

    def __init__(self) -> None:
        self.closed = 0

    async def stop(self) -> None:
        self.closed += 1

    async def aclose(self) -> None:
        self.closed += 1


async def no_model(_update: Any) -> Any:
    raise AssertionError("no model is loaded here")


async def cancelled_while_waiting(stop: Any, started: asyncio.Event) -> asyncio.Future[None]:
    await started.wait()
    stopping = asyncio.ensure_future(stop())
    await asyncio.sleep(0.05)  # the stop now waits for the task it cancelled
    stopping.cancel()  # its caller gives up on it
    await asyncio.wait([stopping], timeout=3.0)
    return stopping


async def test_a_cancelled_stop_of_the_service_still_closes_the_feed_the_publisher_and_redis() -> None:
    ext = ExtenderService(Settings(), ExtenderOptions(), policy=Policy(), publish=False, kafka=False, redis=False)
    started, consumer, publisher, redis = asyncio.Event(), Closing(), Closing(), Closing()
    ext._tasks.append(slow_to_end(started))
    view = ViewFeed(Settings.from_env({}), SnapshotBuilder(), no_model, ExtenderMetrics(), rebuild=lambda force: None)
    view._consumer = consumer  # type: ignore[assignment]
    ext.feed, ext.publisher, ext._redis = view, publisher, redis  # type: ignore[assignment]
    stopping = await cancelled_while_waiting(ext.stop, started)
    assert stopping.cancelled(), "stop() swallowed its own cancel"
    assert (consumer.closed, publisher.closed, redis.closed) == (1, 1, 1), "stop() left the service half-closed"
    assert ext.feed is None and ext.publisher is None and ext._redis is None


async def test_a_cancelled_stop_of_the_feed_still_closes_its_consumer() -> None:
    view = ViewFeed(Settings.from_env({}), SnapshotBuilder(), no_model, ExtenderMetrics(), rebuild=lambda force: None)
    started, consumer = asyncio.Event(), Closing()
    view._task, view._consumer = slow_to_end(started), consumer  # type: ignore[assignment]
    stopping = await cancelled_while_waiting(view.stop, started)
    assert stopping.cancelled(), "stop() swallowed its own cancel"
    assert consumer.closed == 1 and view._consumer is None, "the feed's consumer was left open"
    assert view._task is None
