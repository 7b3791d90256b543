"""What every component of one worker app shares: settings, options, clock, dead letters, metrics, handles.

:func:`~app.streams.app.create_app` attaches one :class:`WorkerContext` to the app it builds; a component
(``register_*(app, settings)``) reads it with :func:`context_of` and may publish a handle for others in
``handles`` (the node-features component publishes its :class:`~app.streams.node_table.NodeStore`). Each app
has its own Prometheus registry (``metrics.registry``) and :class:`~app.streams.health.Health`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import faust

from app.clock import Clock, SystemClock
from app.config import Settings
from app.errors import ConfigError
from app.streams.bounds import Bounds
from app.streams.deadletter import DeadLetters
from app.streams.health import Health
from app.streams.metrics import WorkerMetrics
from app.streams.options import WorkerOptions


@dataclasses.dataclass
class WorkerContext:
    settings: Settings
    options: WorkerOptions
    dead: DeadLetters
    metrics: WorkerMetrics
    health: Health
    clock: Clock = dataclasses.field(default_factory=SystemClock)
    handles: dict[str, Any] = dataclasses.field(default_factory=dict)
    ownership_topic: str = ""
    """The topic whose assigned partitions are this worker's (:mod:`app.streams.ownership`)."""
    bounds: Bounds = dataclasses.field(default_factory=lambda: Bounds(5_000, 64))
    """Caps on nodes and apps, and when each was last heard of (:mod:`app.streams.bounds`)."""
    weights_lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    """Held while a node-weights message is checked and sent: a period's values (:mod:`app.streams.feedback_weights`)
    and eviction's tombstones (:mod:`app.streams.eviction`) never interleave, so a node's tombstone stays its
    last word."""


_ATTRIBUTE = "_rttsched_context"  # on the app: a context refers to its app (dead letters), so a map from apps to
# contexts, weak keys and all, would keep every app made in the process (``rttsched worker`` makes one per start try)


def attach(app: faust.App, settings: Settings, options: WorkerOptions, clock: Clock | None = None,
           metrics: WorkerMetrics | None = None) -> WorkerContext:
    """Attach a new context to ``app``; ``metrics``: the app's series (on a registry of their own by default)."""
    metrics = metrics if metrics is not None else WorkerMetrics()
    ctx = WorkerContext(settings, options, DeadLetters(app, settings, clock, metrics), metrics,
                        Health(metrics.registry), clock or SystemClock(),
                        bounds=Bounds(settings.worker_max_nodes, settings.worker_max_apps))
    setattr(app, _ATTRIBUTE, ctx)
    return ctx


def context_of(app: faust.App) -> WorkerContext:
    """The context of an app built by ``create_app``."""
    ctx = getattr(app, _ATTRIBUTE, None)
    if not isinstance(ctx, WorkerContext):
        raise ConfigError("app", f"{app.conf.id!r} was not built by app.streams.app.create_app")
    return ctx
