"""Faust topics built from the contracts in ``topics/``: name (prefixed), partitions, compaction.

Values and keys travel as raw bytes; agents decode them with :mod:`app.contracts` so that validation
happens at the edge and failures reach dead-letters with their reason.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import faust

from app.config import Settings
from app.contracts import contract

log = logging.getLogger(__name__)


def contract_topic(app: faust.App, settings: Settings, name: str) -> faust.TopicT:
    """The Faust topic of contract ``name`` (raw key and value)."""
    c = contract(name)
    config = {"cleanup.policy": c.cleanup_policy}
    if c.retention_ms >= 0:
        config["retention.ms"] = str(c.retention_ms)
    return app.topic(
        settings.topic(name), partitions=c.partitions, replicas=settings.replicas(c.replication_factor),
        key_serializer="raw", value_serializer="raw", compacting=c.compacted, config=config,
        internal=False,
    )


async def await_delivery(sent: Any) -> None:
    """Wait for what Faust's ``topic.send`` returned (a future of the broker's acknowledgement) to resolve."""
    if isinstance(sent, asyncio.Future):
        await sent


def track_delivery(sent: Any, what: str, *, delivered: Any = None, failed: Any = None,
                   on_failed: Callable[[BaseException], None] | None = None) -> None:
    """For a send nobody waits for, whose loss a later tick makes good (node-weights values and tombstones):
    ``delivered`` counted once the broker acknowledged it; a failure counted in ``failed``, handed to
    ``on_failed`` (the eviction timer keeps the tombstone to send it again) and logged at WARNING (once per
    period with :func:`app.kafka.quiet.quiet_client_errors`) instead of asyncio's "exception was never
    retrieved".

    ``sent`` is what Faust's ``topic.send`` returned (a future of the acknowledgement); anything else is
    taken as delivered. ``delivered`` and ``failed`` have ``inc()`` (Prometheus counter children).
    """
    if not isinstance(sent, asyncio.Future):
        if delivered is not None:
            delivered.inc()
        return

    def done(fut: asyncio.Future[Any]) -> None:
        exc = asyncio.CancelledError() if fut.cancelled() else fut.exception()
        if exc is None:
            if delivered is not None:
                delivered.inc()
            return
        if failed is not None:
            failed.inc()
        if on_failed is not None:
            on_failed(exc)
        log.warning("not delivered: %s: %r", what, exc)

    sent.add_done_callback(done)
