"""Stopping background tasks within a bound: a task that does not end when cancelled is named and left behind.

A service's stop must end whatever its tasks do: one that catches its cancel, or waits on a peer that never answers,
must not hold the process past its grace period.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any


async def cancel_within(tasks: Sequence[asyncio.Task[Any]], timeout_s: float, what: str,
                        log: logging.Logger) -> None:
    """Cancel ``tasks`` and wait ``timeout_s`` at most for them to end; those still running are named in one WARNING
    on ``log`` (``<what> stopping: <names> still running …``) and left behind. Their failures are retrieved, not
    raised; a cancel of the caller is not swallowed."""
    for t in tasks:
        t.cancel()
    if not tasks:
        return
    done, running = await asyncio.wait(tasks, timeout=timeout_s)
    for t in done:
        if not t.cancelled():
            t.exception()
    if running:
        log.warning("%s stopping: %s still running %g s after being cancelled; stopping without it", what,
                    ", ".join(sorted(t.get_name() for t in running)), timeout_s)
