"""The worker's Faust app, built by a factory: no app exists at import time.

:func:`create_app` makes the app from :class:`~app.config.Settings` and runs each component's
``register(app, settings)`` on it; a component adds agents, timers and tables and may read the shared
:class:`~app.streams.context.WorkerContext` (``context_of(app)``). The default components are listed in
:data:`DEFAULT_COMPONENTS`; docs/worker.md shows how to add one.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

import faust
from faust.app.base import BootStrategy
from faust.types import AppT
from mode import Service, ServiceT

from app.clock import Clock
from app.config import Settings
from app.contracts import contract
from app.kafka.admin import InternalTopic
from app.kafka.batches import BatchSender
from app.kafka.client import faust_credentials
from app.streams.changelog import ChangelogTableManager
from app.streams.context import attach
from app.streams.eviction import register_eviction
from app.streams.feedback_loop import TABLE_NAME as FEEDBACK_TABLE
from app.streams.feedback_loop import register_feedback
from app.streams.feedback_table import FeedbackTable
from app.streams.health import register_health_page
from app.streams.metrics import WorkerMetrics, register_metrics_page
from app.streams.node_features import TABLE_NAME as NODE_TABLE
from app.streams.node_features import register_node_features
from app.streams.node_table import NodeStateTable
from app.streams.options import WorkerOptions
from app.streams.ownership import ownership_topic_name, register_ownership
from app.streams.unretrieved import install as install_unretrieved
from app.streams.web import serve_on

Component = Callable[[faust.App, Settings], object]

DEFAULT_COMPONENTS: tuple[Component, ...] = (register_node_features, register_feedback, register_eviction)


def broker_urls(bootstrap: str) -> list[str]:
    """``host:port[,host:port]`` as Faust broker URLs.

    >>> broker_urls("a:9092, b:9093")
    ['kafka://a:9092', 'kafka://b:9093']
    """
    return [f"kafka://{h.strip()}" for h in bootstrap.split(",") if h.strip()]


def default_id(settings: Settings) -> str:
    """The worker group id (Faust app id) when ``--id`` is not given: ``{RTT_TOPIC_PREFIX}rttsched-worker``."""
    return f"{settings.topic_prefix}rttsched-worker"


def worker_topics(settings: Settings, id: str | None = None) -> list[InternalTopic]:
    """The topics a worker group creates for itself: its tables' changelogs (compacted) and its ownership
    topic, all with the source topics' partition count. ``rttsched topics create`` creates them too, so that
    they exist where topic creation is restricted, and again after a broker lost its data."""
    app_id = id or default_id(settings)
    partitions = contract("node-metrics").partitions
    tables = [InternalTopic(f"{app_id}-{table}-changelog", partitions, compacted=True)
              for table in (NODE_TABLE, FEEDBACK_TABLE)]
    return [*tables, InternalTopic(ownership_topic_name(app_id), partitions)]


class StartStep(Service):
    """A step of Faust's start after one of its clients (``after``: ``producer``, ``consumer``): reached, that
    client has started on the broker. ``callbacks`` are called then."""

    def __init__(self, after: str) -> None:
        super().__init__()
        self.after = after
        self.reached = False
        self.callbacks: list[Callable[[], object]] = []

    @property
    def label(self) -> str:
        return f"StartStep(after {self.after})"

    async def on_start(self) -> None:
        self.reached = True
        for callback in self.callbacks:
            callback()


class WorkerBoot(BootStrategy):
    """Faust's boot order (sensors, producer, web server, consumer, assignors, agents, conductor, tables), with a
    :class:`StartStep` after the producer and one after the consumer.

    Until the step after the producer, a failed start has taken nothing over that the worker cannot make again:
    the web server (serving on the port the worker held) and the consumer come after it (``rttsched worker`` waits
    for Kafka again)."""

    def __init__(self, app: faust.App) -> None:
        super().__init__(app)
        self.after_producer = StartStep("producer")
        self.after_consumer = StartStep("consumer")

    def kafka_producer(self) -> list[ServiceT]:
        return [*super().kafka_producer(), self.after_producer]

    def kafka_consumer(self) -> list[ServiceT]:
        consumer = list(super().kafka_consumer())
        return [*consumer[:1], self.after_consumer, *consumer[1:]] if consumer else []


def start_steps(app: AppT) -> WorkerBoot:
    """``app``'s boot strategy, whose :class:`StartStep` after the producer and after the consumer say how far its
    start went."""
    return cast(WorkerBoot, app.boot_strategy)


def create_app(settings: Settings, *, id: str | None = None, components: Sequence[Component] | None = None,
               options: WorkerOptions | None = None, clock: Clock | None = None,
               metrics: WorkerMetrics | None = None, web_socket: socket.socket | None = None) -> faust.App:
    """Build the worker app.

    Parameters
    ----------
    settings : Settings
        Broker (``bootstrap_servers``), topic prefix, windows, metrics port (0: no web server).
    id : str, optional
        Faust app id = consumer group and prefix of internal topics; default
        ``"{topic_prefix}rttsched-worker"``. Workers with the same id split the partitions.
    components : sequence of ``register(app, settings)``, optional
        Default :data:`DEFAULT_COMPONENTS`.
    options, clock
        Worker options (default from settings) and the clock (tests inject one).
    metrics : WorkerMetrics, optional
        The app's series and their registry, served at ``/metrics``; by default a registry of the app's own, so
        two apps in one process never share a series.
    web_socket : socket.socket, optional
        A bound, listening socket for the web server (:func:`app.listen.hold_listen`) instead of binding
        ``RTT_METRICS_HOST``:``RTT_METRICS_PORT`` once the app runs.
    """
    opts = options or WorkerOptions.from_settings(settings)
    Path(opts.datadir).mkdir(parents=True, exist_ok=True)
    partitions = contract("node-metrics").partitions
    app = faust.App(
        id or default_id(settings),
        broker=broker_urls(settings.bootstrap_servers),
        store="memory://",
        autodiscover=False,
        datadir=opts.datadir,
        key_serializer="raw",
        value_serializer="raw",
        topic_partitions=partitions,
        topic_replication_factor=settings.replicas(),
        topic_disable_leader=True,
        broker_session_timeout=opts.session_timeout_s,
        broker_heartbeat_interval=min(3.0, opts.session_timeout_s / 3),
        producer_linger=0.005,
        producer_max_batch_size=512 * 1024,
        producer_max_request_size=4 * 1024 * 1024,
        web_enabled=settings.metrics_port > 0,
        web_port=settings.metrics_port or 6066,
        web_host="127.0.0.1",
        web_bind=settings.metrics_host,
        broker_credentials=faust_credentials(settings),
        TableManager=ChangelogTableManager,
    )
    app.boot_strategy = WorkerBoot(app)
    if web_socket is not None:  # before any page is registered: they are added to the web driver there and then
        serve_on(app, web_socket)
    ctx = attach(app, settings, opts, clock, metrics)
    ctx.ownership_topic = register_ownership(app)

    @app.task
    async def count_unretrieved_sends() -> None:  # on the loop the app runs on
        failures = ctx.metrics.send_failures
        install_unretrieved(asyncio.get_running_loop(), lambda topic: failures.labels(topic, "dropped"))

    register_metrics_page(app, ctx.metrics)
    register_health_page(app, ctx.health)
    for register in DEFAULT_COMPONENTS if components is None else components:
        register(app, settings)
    manager = cast(ChangelogTableManager, app.tables)
    manager.on_recreated = write_again
    manager.rewrite_failures = ctx.metrics.changelog_rewrite_failures
    for table in (NODE_TABLE, FEEDBACK_TABLE):  # at 0 from the start: a series that first appears at its final
        ctx.metrics.changelog_rewinds.labels(table)  # value (one wipe, all partitions at once) shows no increase()
        ctx.metrics.changelog_rewrite_failures.labels(table)
    return app


def write_again(table: object, partitions: set[int]) -> bool:
    """Mark the state ``table`` keeps of its changelog ``partitions`` to be written by the next checkpoint: the
    recovery found them recreated below what it had read of them (:mod:`app.streams.changelog`); whether it was.

    The sender the table's rows went out on forgets the end it recorded on them, so its next write there is not
    found rewound again: one wipe, one rewrite and one count per partition.
    """
    sender: BatchSender | None
    if isinstance(table, NodeStateTable):
        table.rewrite(partitions)
        sender = table.intake.sender if table.intake is not None else None
    elif isinstance(table, FeedbackTable) and table.on_rewound is not None:
        table.on_rewound(partitions)
        sender = table.sender
    else:
        return False
    if isinstance(sender, BatchSender):
        sender.forget(table.changelog_topic.get_topic_name(), partitions)
    return True
