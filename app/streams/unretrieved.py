"""Sends nobody waits for that the broker refused: one WARNING per period and a count, never asyncio's traceback.

Faust's producer hands back a future for every message (``FutureMessage``); some sends of Faust's own (a table's
changelog row through ``send_changelog``, a marker after a flush) are never awaited, so when the broker refuses
them (a broker restarting answers ``UnknownError``) asyncio reports each future as "exception was never
retrieved" with a traceback at ERROR — a worker logged 16 of them after its broker came back. The loop's
exception handler here takes those reports over: each is counted in ``rtt_worker_send_failures_total{topic,
outcome="dropped"}`` and said as ``not delivered: …`` (kept to one per period with
:func:`app.kafka.quiet.quiet_client_errors`); every other report goes to the handler that was there before.
What such a send carried is not lost for good: the state's next checkpoint writes what it has not seen stored
(docs/worker.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from faust.types.tuples import FutureMessage

log = logging.getLogger("app.streams.topics")  # its "not delivered: " lines are kept to one per period

Counted = Callable[[str], Any]  # topic -> a counter child with inc()


def _topic_of(future: FutureMessage) -> str:
    channel = getattr(future.message, "channel", None)
    try:
        return str(channel.get_topic_name()) if channel is not None else "unknown"
    except Exception:  # a channel that is no topic
        return "unknown"


def install(loop: asyncio.AbstractEventLoop, failed: Counted) -> None:
    """Make ``loop``'s exception handler count and say refused ``FutureMessage`` sends (``failed(topic).inc()``)
    and pass every other report to the handler installed before (or asyncio's default)."""
    previous = loop.get_exception_handler()

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        future, exc = context.get("future"), context.get("exception")
        if isinstance(future, FutureMessage) and exc is not None:
            topic = _topic_of(future)
            failed(topic).inc()
            log.warning("not delivered: a message to %s nobody waited for: %r", topic, exc)
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)
