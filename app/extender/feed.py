"""Keep the global view current: read node-features, node-weights and model-updates, rebuild, swap.

Every extender replica reads every partition of the three compacted topics from the beginning (no consumer
group: each needs the whole view). Messages go into the :class:`~app.scheduler.builder.SnapshotBuilder`;
at most every ``rebuild_interval_s`` a new snapshot is built and swapped in. Model blobs load in worker
threads. The feed is *caught up* once every partition's position reached the end offset it had at start
and every model announced so far has loaded (or failed): that is when a cold extender becomes ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiokafka.errors import KafkaError, OffsetOutOfRangeError

from app.clock import Clock, SystemClock
from app.config import Settings
from app.contracts import contract, decode
from app.contracts.admission import check_key, check_time
from app.errors import ContractError
from app.extender.metrics import ExtenderMetrics
from app.extender.models import ModelLoader, install_model
from app.kafka.client import client_options
from app.kafka.positions import PositionGuard
from app.scheduler.builder import SnapshotBuilder

log = logging.getLogger(__name__)
TOPICS = ("node-features", "node-weights", "model-updates")
REASONS = ("key_mismatch", "ts_in_future")  # counted as results of their own in feed_messages


class ViewFeed:
    """The background consumer of the view's topics.

    ``on_model`` is called (awaited) after a model from a message was installed, e.g. to cache it in Redis.
    ``rebuild`` builds and swaps a snapshot; the feed calls it when the builder is dirty.
    """

    def __init__(
        self, settings: Settings, builder: SnapshotBuilder, loader: ModelLoader, metrics: ExtenderMetrics,
        rebuild: Callable[[], object], rebuild_interval_s: float = 0.2,
        on_model: Callable[[Mapping[str, Any]], Awaitable[Any]] | None = None, clock: Clock | None = None,
    ) -> None:
        self._settings = settings
        self._clock = clock or SystemClock()
        self._builder = builder
        self._loader = loader
        self._metrics = metrics
        self._rebuild = rebuild
        self._interval = rebuild_interval_s
        self._on_model = on_model
        self._topic_of = {settings.topic(t): t for t in TOPICS}
        self._consumer: Any = None
        self._guard: PositionGuard | None = None
        self._task: asyncio.Task[None] | None = None
        self._loads: set[asyncio.Task[bool]] = set()
        self._behind: dict[Any, int] = {}  # partitions not yet read to their start-time end offset
        self._last_build = -1e9
        self.caught_up = asyncio.Event()

    async def start(self) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        consumer = AIOKafkaConsumer(**client_options(
            self._settings, group_id=None, enable_auto_commit=False, auto_offset_reset="none",
            max_partition_fetch_bytes=4 * 1024 * 1024,
        ))
        await consumer.start()
        self._consumer = consumer
        self._guard = PositionGuard(consumer, "extender-view", registry=self._metrics.registry,
                                    topic_label=lambda t: self._topic_of.get(t, t))
        tps = [TopicPartition(self._settings.topic(t), p) for t in TOPICS for p in range(contract(t).partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        self._behind = {tp: end for tp, end in ends.items() if end > 0}
        log.info("view feed: %d partitions, %d messages to catch up on", len(tps), sum(self._behind.values()))
        self._task = asyncio.get_running_loop().create_task(self._run(), name="extender-view-feed")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._loads) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._task = None
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    def release_current_load(self) -> None:
        """The calling model load waits for the registry: readiness no longer waits for it."""
        task = asyncio.current_task()
        if task is not None:
            self._loads.discard(task)  # type: ignore[arg-type]

    async def _run(self) -> None:
        assert self._guard is not None
        while True:
            try:
                try:
                    batches = await self._consumer.getmany(timeout_ms=int(self._interval * 1000), max_records=10_000)
                except OffsetOutOfRangeError as exc:
                    await self._guard.out_of_range(exc.args[0])
                    continue
                self._guard.note(batches)
                for tp, messages in batches.items():
                    topic = self._topic_of.get(tp.topic, tp.topic)
                    for msg in messages:
                        self.apply(topic, msg.key, msg.value)
                await self._check_caught_up()
                self._maybe_rebuild()
                await self._guard.after_fetch()
            except asyncio.CancelledError:
                raise
            except KafkaError as exc:
                log.warning("view feed: %r; retrying", exc)
                await asyncio.sleep(1.0)
            except Exception:
                log.exception("view feed iteration failed; retrying")
                await asyncio.sleep(1.0)

    async def _check_caught_up(self) -> None:
        if self.caught_up.is_set():
            return
        for tp, end in list(self._behind.items()):
            if await self._consumer.position(tp) >= end:
                del self._behind[tp]
        if not self._behind and not self._loads:
            self._rebuild()
            self._last_build = time.monotonic()
            self.caught_up.set()
            log.info("view feed caught up: %d nodes", self._builder.node_count)

    def _maybe_rebuild(self) -> None:
        if not self.caught_up.is_set() or not self._builder.dirty:
            return
        if time.monotonic() - self._last_build >= self._interval:
            self._rebuild()
            self._last_build = time.monotonic()

    def apply(self, topic: str, key: bytes | None, raw: bytes | None) -> str:
        """Apply one message of ``topic`` (contract name); returns the result label it was counted under."""
        result = self._apply(topic, key, raw)
        self._metrics.feed_messages.labels(topic, result).inc()
        return result

    def _apply(self, topic: str, key: bytes | None, raw: bytes | None) -> str:
        if raw is None:  # tombstone on a compacted topic
            if topic in ("node-features", "node-weights") and key:
                self._builder.remove_node(key.decode("utf-8", "replace"))
                return "deleted"
            return "ignored"
        try:
            value = decode(topic, raw)
            check_key(topic, key, value)
            # a view value from the future would pin its node (newer values only replace older ones);
            # an old one is merely stale, which the snapshot already handles
            check_time(topic, value, now=self._clock.now(), max_skew_s=self._settings.max_clock_skew_s,
                       max_age_s=math.inf)
        except ContractError as exc:
            log.debug("%s message rejected: %s", topic, exc)
            return "rejected" if exc.reason not in REASONS else exc.reason
        if topic == "node-features":
            return "applied" if self._builder.apply_node_features(value) else "ignored"
        if topic == "node-weights":
            return "applied" if self._builder.apply_node_weights(value) else "ignored"
        version = self._builder.model_version(value["model_key"])
        if version is not None and version >= value["version"]:
            return "ignored"
        task = asyncio.get_running_loop().create_task(self.load_model(value))
        self._loads.add(task)
        task.add_done_callback(self._loads.discard)
        return "applied"

    async def load_model(self, update: Mapping[str, Any]) -> bool:
        return await install_model(update, self._loader, self._builder, self._metrics, self._on_model)
