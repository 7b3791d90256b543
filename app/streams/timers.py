"""Periodic work of a worker app that never ends the worker: :func:`timer`.

Faust's ``@app.timer`` runs its function in a task of the app, and an exception that escapes it crashes
the app (mode's ``Service.crash``): the worker exits. The worker's timers write to Kafka — checkpoints,
error periods, node-features, node-weights — and with the broker away longer than the producer's request
timeout (40 s) those writes fail: the worker used to exit about 40 s into a broker outage.

:func:`timer` is ``app.timer`` with a tick that catches what its function raises: the failure is logged
(WARNING, with the timer's name and the error), counted in ``rtt_worker_timer_failures_total{timer}``, and
the next tick runs as usual. The functions lose nothing by failing: a checkpoint whose write failed hands
its rows back to the next one, an error period's closed trackers and staged messages (prediction-errors, the
retrain-events of its drifts) go out with the next checkpoint that is stored, and a message the broker did
not acknowledge stays staged for the checkpoint after (:mod:`app.streams.feedback_outbox`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable

import faust

from app.streams.context import context_of

log = logging.getLogger(__name__)

Tick = Callable[[], Awaitable[None]]


def timer(app: faust.App, interval_s: float, name: str) -> Callable[[Tick], Tick]:
    """Decorator: run the coroutine function every ``interval_s`` on ``app``; a tick that raises is logged and
    counted, never the end of the worker."""
    failures = context_of(app).metrics.timer_failures.labels(name)

    def register(fun: Tick) -> Tick:
        @functools.wraps(fun)
        async def tick() -> None:
            try:
                await fun()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the worker goes on; the next tick tries again
                failures.inc()
                log.warning("timer %s: this tick failed (%r); the next one runs in %.1f s", name, exc, interval_s)

        app.timer(interval_s, name=name)(tick)
        return tick

    return register
