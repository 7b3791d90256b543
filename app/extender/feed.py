"""Keep the global view current: read node-features, node-weights and model-updates, rebuild, swap.

Every extender replica reads every partition of the three compacted topics from the beginning (no consumer
group: each needs the whole view). With ``on_completion``, it also reads task-completions from their end:
each completion's ``task_id`` is handed to it (the service forgets the pod it assumed, so the pods it
counts as running on a node are the ones still running, not the ones expected to).
Messages go into the :class:`~app.scheduler.builder.SnapshotBuilder`;
at most every ``rebuild_interval_s`` a new snapshot is built and swapped in. Model blobs load in worker
threads. The feed is *caught up* once every partition's position reached the end offset it had at start
and every model announced so far has loaded (or failed): that is when a cold extender becomes ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from app.config import Settings
from app.contracts import contract, decode
from app.errors import ContractError
from app.extender.metrics import ExtenderMetrics
from app.extender.models import ModelLoader, install_model
from app.scheduler.builder import SnapshotBuilder

log = logging.getLogger(__name__)
TOPICS = ("node-features", "node-weights", "model-updates")
COMPLETIONS = "task-completions"


class ViewFeed:
    """The background consumer of the view's topics.

    ``on_model`` is called (awaited) after a model from a message was installed, e.g. to cache it in Redis.
    ``rebuild`` builds and swaps a snapshot; the feed calls it when the builder is dirty.
    """

    def __init__(
        self, settings: Settings, builder: SnapshotBuilder, loader: ModelLoader, metrics: ExtenderMetrics,
        rebuild: Callable[[], object], rebuild_interval_s: float = 0.2,
        on_model: Callable[[Mapping[str, Any]], Awaitable[Any]] | None = None,
        on_completion: Callable[[str], object] | None = None,
    ) -> None:
        self._settings = settings
        self._builder = builder
        self._loader = loader
        self._metrics = metrics
        self._rebuild = rebuild
        self._interval = rebuild_interval_s
        self._on_model = on_model
        self._on_completion = on_completion
        self._topic_of = {settings.topic(t): t for t in (*TOPICS, COMPLETIONS)}
        self._consumer: Any = None
        self._task: asyncio.Task[None] | None = None
        self._loads: set[asyncio.Task[bool]] = set()
        self._behind: dict[Any, int] = {}  # partitions not yet read to their start-time end offset
        self._last_build = -1e9
        self.caught_up = asyncio.Event()

    async def start(self) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._settings.bootstrap_servers, group_id=None, enable_auto_commit=False,
            auto_offset_reset="earliest", max_partition_fetch_bytes=4 * 1024 * 1024,
        )
        await consumer.start()
        self._consumer = consumer
        tps = [TopicPartition(self._settings.topic(t), p) for t in TOPICS for p in range(contract(t).partitions)]
        done = [TopicPartition(self._settings.topic(COMPLETIONS), p) for p in range(contract(COMPLETIONS).partitions)]
        consumer.assign(tps + (done if self._on_completion is not None else []))
        await consumer.seek_to_beginning(*tps)
        if self._on_completion is not None:
            await consumer.seek_to_end(*done)
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

    async def _run(self) -> None:
        while True:
            try:
                batches = await self._consumer.getmany(timeout_ms=int(self._interval * 1000), max_records=10_000)
                for tp, messages in batches.items():
                    topic = self._topic_of.get(tp.topic, tp.topic)
                    for msg in messages:
                        self.apply(topic, msg.key, msg.value)
                await self._check_caught_up()
                self._maybe_rebuild()
            except asyncio.CancelledError:
                raise
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
        except ContractError as exc:
            log.debug("%s message rejected: %s", topic, exc)
            return "rejected"
        if topic == "node-features":
            return "applied" if self._builder.apply_node_features(value) else "ignored"
        if topic == "node-weights":
            return "applied" if self._builder.apply_node_weights(value) else "ignored"
        if topic == COMPLETIONS:
            if self._on_completion is None:
                return "ignored"
            self._on_completion(value["task_id"])
            return "applied"
        version = self._builder.model_version(value["model_key"])
        if version is not None and version >= value["version"]:
            return "ignored"
        task = asyncio.get_running_loop().create_task(self.load_model(value))
        self._loads.add(task)
        task.add_done_callback(self._loads.discard)
        return "applied"

    async def load_model(self, update: Mapping[str, Any]) -> bool:
        return await install_model(update, self._loader, self._builder, self._metrics, self._on_model)
