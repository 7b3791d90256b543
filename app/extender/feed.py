"""Keep the global view current: read node-features, node-weights and model-updates into the builder.

Every extender replica reads every partition of the three compacted topics from the beginning (no consumer
group: each needs the whole view). The feed runs in the background from the moment the port is bound and
never gives up: without a broker it retries, and while a topic is missing it waits for it — reporting
either every ``report_s`` (topics are listed from the cluster's metadata, which never creates them; asking
for one topic's metadata would make Tansu or an auto-creating Kafka create it with the wrong partition
count). :attr:`ViewFeed.status` says where it stands, for ``/readyz``. Once it reads, a broker that goes away
does not make the consumer fail (it retries inside): while nothing arrives for ``report_s`` the feed asks the
broker for its metadata, and one that does not answer is a degraded reason (``kafka``: ``/readyz``,
``rtt_extender_degraded``) until it answers or records arrive again.

With ``on_completion``, the feed also reads task-completions, from their end on its first connection: each
completion's ``task_id`` is handed to it (the service forgets the pod it assumed, so the pods it counts as
running on a node are the ones still running, not the ones expected to be). A reconnect reads task-completions
on from the position the feed had read to (saved as soon as a batch is applied, so no batch is applied twice),
so the completions produced while it was away are applied too; a partition added while it was away is read
from its start, and a position the partition no longer has (before its start, or beyond its end: the broker
lost its data, the topic was recreated) is reset to the partition's start
(:class:`~app.kafka.positions.PositionGuard`). The compacted topics are read again from their start on every
connection: their values only move the view forward, so nothing is lost.

Messages are applied in slices (:mod:`app.extender.pacing`), so a large backlog never holds the event
loop; after each batch the feed asks for a rebuild (the service builds at most every
``rebuild_interval_s``). Model blobs load in worker threads. The feed is *caught up* once every partition's
position reached the end offset it had when the feed was assigned and every model announced so far has
loaded (or failed): that is when a cold extender becomes ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import OffsetOutOfRangeError

from app.clock import Clock, SystemClock
from app.config import Settings
from app.contracts.admission import check_key, check_time
from app.contracts.edge import EdgeDecoder
from app.errors import ContractError
from app.extender.metrics import ExtenderMetrics
from app.extender.model_retry import KAFKA, Degraded
from app.extender.models import ModelLoader, install_model
from app.extender.pacing import Slicer
from app.kafka.client import consumer_options
from app.kafka.positions import PositionGuard
from app.kafka.quiet import quiet_client_errors
from app.kafka.starting import start_or_close
from app.scheduler.builder import SnapshotBuilder
from app.stopping import cancel_within

log = logging.getLogger(__name__)
TOPICS = ("node-features", "node-weights", "model-updates")
MAX_RECORDS = 50  # per fetch: aiokafka builds a fetch's records in one go, 10-30 us each, inside one loop step
RETRY_S = (0.5, 1.0, 2.0, 5.0)  # waits between connection attempts
COMPLETIONS = "task-completions"
STOP_TIMEOUT_S = 5.0  # stop() gives up on a cancelled task that has not ended by then (named in a WARNING)
REASONS = ("key_mismatch", "ts_in_future")  # counted as results of their own in feed_messages


class ViewFeed:
    """The background consumer of the view's topics.

    ``rebuild(force)`` asks the owner for a new snapshot (``force``: the view may now be served);
    ``on_model`` is awaited after a model from a message was installed, e.g. to rebuild at once and cache it
    in Redis.
    """

    def __init__(
        self, settings: Settings, builder: SnapshotBuilder, loader: ModelLoader, metrics: ExtenderMetrics,
        rebuild: Callable[[bool], object], rebuild_interval_s: float = 0.2,
        on_model: Callable[[Mapping[str, Any]], Awaitable[Any]] | None = None, report_s: float = 10.0,
        clock: Clock | None = None, on_completion: Callable[[str], object] | None = None,
        degraded: Degraded | None = None,
    ) -> None:
        self._settings = settings
        self._clock = clock or SystemClock()
        self._builder = builder
        self._loader = loader
        self._metrics = metrics
        self._rebuild = rebuild
        self._interval = rebuild_interval_s
        self._on_model = on_model
        self._report_s = report_s
        self._on_completion = on_completion
        self._topic_of = {settings.topic(t): t for t in (*TOPICS, *((COMPLETIONS,) if on_completion else ()))}
        self._decoders = {t: EdgeDecoder(t) for t in (*TOPICS, COMPLETIONS)}  # the worker's intakes' decoding
        self._counted: dict[tuple[str, str], Any] = {}  # (topic, result) -> its feed_messages child
        self._consumer: Any = None
        self._guard: PositionGuard | None = None
        self._task: asyncio.Task[None] | None = None
        self._loads: set[asyncio.Task[bool]] = set()
        self._behind: dict[Any, int] = {}  # partitions not yet read to their end offset at assignment
        self._resume: dict[TopicPartition, int] = {}  # task-completions partition -> next offset to read, kept
        # across connections: a reconnect reads on from there (the first connection starts at the end)
        self._completions_seeked = False  # task-completions were positioned once: later ones read on
        self._said = ("", 0.0)
        self._degraded = degraded
        self._heard = 0.0  # monotonic time the broker last gave records or answered a probe
        self.status = "not started"
        self.caught_up = asyncio.Event()

    def start(self) -> None:
        """Start the background task (returns at once; the task connects, waits for topics, reads)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="extender-view-feed")

    async def stop(self) -> None:
        """Cancel the feed and its model loads, then close the consumer: a task still running ``STOP_TIMEOUT_S``
        after its cancel is named in one WARNING and left behind, so the extender stops whatever does not end. A
        cancel of stop() itself while it waits for them ends that wait: the consumer is still closed, then the
        cancel goes on."""
        tasks = [t for t in (self._task, *self._loads) if t is not None]
        try:
            await cancel_within(tasks, STOP_TIMEOUT_S, "view feed", log)
        finally:
            self._task = None
            await self._close()

    # -- connection
    def _report(self, status: str, level: int = logging.WARNING) -> None:
        """Set :attr:`status`; log it when it changes, and again every ``report_s`` while it lasts."""
        self.status = status
        now = time.monotonic()
        if status != self._said[0] or now - self._said[1] >= self._report_s:
            log.log(level, "view feed: %s", status)
            self._said = (status, now)

    def release_current_load(self) -> None:
        """The calling model load waits for the registry: readiness no longer waits for it."""
        task = asyncio.current_task()
        if task is not None:
            self._loads.discard(task)  # type: ignore[arg-type]

    async def _close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(Exception):
                await consumer.stop()

    async def _run(self) -> None:
        quiet_client_errors(self._report_s)
        attempt = 0
        while True:
            try:
                await self._connect()
                await self._wait_for_topics()
                attempt = 0
                await self._consume()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # no broker, broker gone during set-up, ...: retry, never die
                detail = f"Kafka at {self._settings.bootstrap_servers} not usable ({exc}); retrying"
                self._report(detail)
                if self.caught_up.is_set() and self._degraded is not None:  # serving: /readyz says it this way
                    self._degraded.waiting(KAFKA, "view-feed", detail)
                await self._close()
                await asyncio.sleep(RETRY_S[min(attempt, len(RETRY_S) - 1)])
                attempt += 1

    async def _connect(self) -> None:
        if not self.status.startswith("Kafka at"):  # not retrying: say so (retries are reported by _run)
            self._report(f"connecting to Kafka at {self._settings.bootstrap_servers}", logging.INFO)
        consumer = AIOKafkaConsumer(**consumer_options(
            self._settings, group_id=None, enable_auto_commit=False, auto_offset_reset="none",
            max_partition_fetch_bytes=4 * 1024 * 1024, request_timeout_ms=10_000,
        ))
        await start_or_close(consumer)
        self._consumer = consumer
        self._guard = PositionGuard(consumer, "extender-view", registry=self._metrics.registry,
                                    topic_label=lambda t: self._topic_of.get(t, t))
        self._answered()

    async def _wait_for_topics(self) -> None:
        """Assign every partition of the view's topics once they all exist; report the missing ones."""
        names = list(self._topic_of)
        while True:
            cluster = await self._consumer._client.fetch_all_metadata()
            missing = [t for t in names if not cluster.partitions_for_topic(t)]
            if not missing:
                break
            self._report(f"waiting for topics {', '.join(missing)} on Kafka at {self._settings.bootstrap_servers} "
                         "(create them with `rttsched topics`)")
            await asyncio.sleep(min(1.0, self._report_s))
        every = [TopicPartition(t, p) for t in names for p in sorted(cluster.partitions_for_topic(t))]
        done = [tp for tp in every if self._topic_of[tp.topic] == COMPLETIONS]  # read from their end
        tps = [tp for tp in every if self._topic_of[tp.topic] != COMPLETIONS]
        self._consumer.assign(every)
        await self._consumer.seek_to_beginning(*tps)
        await self._seek_completions(done)
        ends = await self._consumer.end_offsets(tps)
        self._behind = {tp: end for tp, end in ends.items() if end > 0}
        self._report(f"catching up: {sum(self._behind.values())} messages on {len(tps)} partitions", logging.INFO)

    async def _seek_completions(self, done: list[TopicPartition]) -> None:
        """task-completions from where the feed had read them to (checked against the partitions: one out of
        range is read from its start). On the first connection every partition is read from its end; on a later
        one a partition the feed never read (added to the topic while it was away) is read from its start."""
        assert self._guard is not None
        first = not self._completions_seeked
        wanted = {tp: self._resume[tp] for tp in done if tp in self._resume}
        if not first:
            wanted.update({tp: 0 for tp in done if tp not in wanted})  # new since: from its start (guarded)
        known = await self._guard.on_assigned(wanted)
        for tp, pos in known.items():
            self._consumer.seek(tp, pos)
            self._resume[tp] = pos
        fresh = [tp for tp in done if tp not in known]
        if fresh:
            await self._consumer.seek_to_end(*fresh)
            for tp in fresh:  # a reconnect before the first fetch reads on from here too
                async with asyncio.timeout(10.0):  # not asyncio.wait_for: in Python 3.11 it loses a cancel that
                    # comes as the position is answered, and the feed, run on, kept stop() waiting for it without end
                    self._resume[tp] = await self._consumer.position(tp)
        self._completions_seeked = True
        if known:
            log.info("view feed: task-completions read on from %s",
                     ", ".join(f"[{tp.partition}]@{pos}" for tp, pos in sorted(known.items())))

    def _keep_completion_positions(self, guard: PositionGuard) -> None:
        """Remember how far task-completions were read (the guard's positions: read, reset or found)."""
        for tp, pos in guard.next_offsets.items():
            if tp in self._resume:
                self._resume[tp] = pos

    # -- reading
    async def _consume(self) -> None:
        slicer = Slicer()
        last_build = -1e9
        guard = self._guard
        assert guard is not None
        while True:
            slicer.restart()
            try:
                batches = await self._consumer.getmany(timeout_ms=int(self._interval * 1000),
                                                       max_records=MAX_RECORDS)
            except OffsetOutOfRangeError as exc:  # retention deleted what the position points at
                await guard.out_of_range(exc.args[0])
                self._keep_completion_positions(guard)
                continue
            guard.note(batches)
            if any(batches.values()):
                self._answered()
            elif time.monotonic() - self._heard >= self._report_s:
                await self._probe()
            if slicer.due():  # getmany waited, then built the records in this same loop step: apply them in the next
                await slicer.pause()
            now_ms = time.time() * 1000.0
            for tp, messages in batches.items():
                topic = self._topic_of.get(tp.topic, tp.topic)
                if messages:  # how late the view is: the newest record of the partition in this fetch
                    self._metrics.feed_delay.labels(topic).observe(max(0.0, now_ms - messages[-1].timestamp) / 1000.0)
                resume = tp in self._resume  # a task-completions partition
                for msg in messages:
                    self.apply(topic, msg.key, msg.value)
                    if resume:  # applied: a reconnect reads on after it, whatever fails next
                        self._resume[tp] = msg.offset + 1
                    if slicer.due():
                        await slicer.pause()
            if not self.caught_up.is_set():
                await self._check_caught_up()
            elif self._builder.dirty and time.monotonic() - last_build >= self._interval:
                self._rebuild(False)
                last_build = time.monotonic()
            await guard.after_fetch()  # a position beyond its partition's end: the topic was wiped
            self._keep_completion_positions(guard)

    def _answered(self) -> None:
        """The broker answered: a ``kafka`` degraded reason, if any, is over."""
        self._heard = time.monotonic()
        if self._degraded is not None:
            self._degraded.done(KAFKA, "view-feed")

    async def _probe(self) -> None:
        """Nothing came for ``report_s``: ask the broker for its metadata; no answer is a degraded reason."""
        servers = self._settings.bootstrap_servers
        try:
            async with asyncio.timeout(min(5.0, self._report_s)):  # a cancel as the look is answered is kept
                await self._consumer._client.fetch_all_metadata()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._heard = time.monotonic()  # asked again in report_s
            detail = f"Kafka at {servers} not answering ({type(exc).__name__}: {exc}); the view is not updated"
            self._report(detail)
            if self._degraded is not None:
                self._degraded.waiting(KAFKA, "view-feed", detail)
            return
        self._answered()
        if self.status.startswith("Kafka at"):
            self._report(f"Kafka at {servers} answers again", logging.INFO)

    async def _check_caught_up(self) -> None:
        for tp, end in list(self._behind.items()):
            if await self._consumer.position(tp) >= end:
                del self._behind[tp]
        if self._behind:
            self._report(f"catching up: {len(self._behind)} partitions behind", logging.DEBUG)
        elif self._loads:
            self._report(f"loading {len(self._loads)} models", logging.INFO)
        else:
            self._rebuild(True)
            self.caught_up.set()
            self._report(f"caught up: {self._builder.node_count} nodes", logging.INFO)

    def apply(self, topic: str, key: bytes | None, raw: bytes | None) -> str:
        """Apply one message of ``topic`` (contract name); returns the result label it was counted under."""
        result = self._apply(topic, key, raw)
        counter = self._counted.get((topic, result))
        if counter is None:
            counter = self._counted[topic, result] = self._metrics.feed_messages.labels(topic, result)
        counter.inc()
        return result

    def _apply(self, topic: str, key: bytes | None, raw: bytes | None) -> str:
        if raw is None:  # tombstone on a compacted topic
            if topic in ("node-features", "node-weights") and key:
                self._builder.remove_node(key.decode("utf-8", "replace"))
                return "deleted"
            return "tombstone" if topic == "model-updates" else "ignored"  # a model is never deleted
        try:
            value = self._decoders[topic](raw)
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
