"""SIGTERM stops the wait for Kafka at start even when it comes as a try ends.

Python 3.11's ``asyncio.wait_for`` drops a cancel that comes as the awaited call returns or fails: a worker, trainer or
bridge told to stop as a try (bounded by ``RTT_KAFKA_START_WAIT_S``) was refused went on waiting, up to that bound,
and did not stop at once as it says it does.
"""

from __future__ import annotations

import asyncio

from lost_cancel import AnsweredAsCancelled, ends_cancelled

from app.config import Settings
from app.kafka.admin import TopicError, wait_reachable


async def short_sleep(_s: float) -> None:
    await asyncio.sleep(0.01)  # the backoff, short


async def test_a_stop_as_a_try_is_refused_ends_the_wait() -> None:
    check = AnsweredAsCancelled(error=TopicError("cannot reach Kafka at 127.0.0.1:9: refused"))
    waiting = wait_reachable(Settings(kafka_bootstrap="127.0.0.1:9", kafka_start_wait_s=600.0), ("node-metrics",),
                             service="trainer", check=check, sleep=short_sleep)
    assert await ends_cancelled(check, waiting), f"the wait ran on: {check.calls} tries"
    assert check.calls == 1


async def test_a_stop_as_a_try_is_answered_ends_the_wait() -> None:
    check = AnsweredAsCancelled()
    waiting = wait_reachable(Settings(kafka_bootstrap="127.0.0.1:9", kafka_start_wait_s=600.0), ("node-metrics",),
                             service="trainer", check=check, sleep=short_sleep)
    assert await ends_cancelled(check, waiting), "the wait returned as if the broker had answered before the stop"
