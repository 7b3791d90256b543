"""The extender's state and verbs, independent of HTTP: view, assumed pods, policy, publisher, feeds.

Handlers call :meth:`ExtenderService.filter` and :meth:`ExtenderService.prioritize`: plain functions that
read the current snapshot once and never await anything. Everything that talks to Kafka or Redis runs in
background tasks started by :meth:`ExtenderService.start`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from app.clock import Clock, SystemClock
from app.config import Settings
from app.extender.feed import ViewFeed
from app.extender.metrics import ExtenderMetrics
from app.extender.models import ModelLoader, install_model
from app.extender.options import ExtenderOptions
from app.extender.protocol import ExtenderArgs, ProtocolError, filter_result, priority_list
from app.extender.publisher import KafkaSink, PredictionPublisher, Sink
from app.extender.warm import RunningRefresher, warm_start
from app.scheduler.assumed import AssumedPods
from app.scheduler.builder import SnapshotBuilder
from app.scheduler.cache import CacheKeys, store_model_update
from app.scheduler.decide import DecideParams, Decision, decide
from app.scheduler.podinfo import PodError, PodInfo, pod_info
from app.scheduler.policy import Policy, load_policy
from app.scheduler.snapshot import SnapshotHolder

log = logging.getLogger(__name__)


class ExtenderService:
    """One extender instance.

    Parameters
    ----------
    settings, options
        Shared settings and the extender's own options (read from ``settings`` when omitted).
    policy
        SLA / anti-affinity / contention policy; read from ``options.policy_file`` when omitted.
    loader
        Model loader for model-updates (default: the model registry of ``settings``).
    sink
        Where rtt-predictions go (default: Kafka); pass ``publish=False`` to publish nothing.
    kafka, redis
        Whether to run the Kafka feed, and whether to warm start / refresh from ``settings.redis_url``.
    """

    def __init__(
        self, settings: Settings, options: ExtenderOptions | None = None, *, policy: Policy | None = None,
        clock: Clock | None = None, loader: ModelLoader | None = None, sink: Sink | None = None,
        publish: bool = True, kafka: bool = True, redis: bool = True,
    ) -> None:
        self.settings = settings
        self.options = options or ExtenderOptions.from_settings(settings)
        self.policy = policy if policy is not None else load_policy(self.options.policy_file)
        self.clock = clock or SystemClock()
        self.metrics = ExtenderMetrics()
        self.holder = SnapshotHolder()
        self.builder = SnapshotBuilder()
        self.assumed = AssumedPods(self.policy.assumed_ttl_s, self.policy.scrape_delay_s)
        self.params = DecideParams(self.policy, self.options.credibility_prior, self.options.stale_after_s)
        self.keys = CacheKeys(settings.topic_prefix)
        self._loader = loader
        self._sink = sink
        self._publish, self._kafka, self._redis_on = publish, kafka, redis and bool(settings.redis_url)
        self.publisher: PredictionPublisher | None = None
        self.feed: ViewFeed | None = None
        self._redis: Any = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._serving = False
        self._stale_reason: str | None = None
        self.metrics.track_snapshot_age(self._age)

    # -- view
    def _age(self) -> float:
        snap = self.holder.current
        return snap.age(self.clock.now()) if snap is not None else float("inf")

    @property
    def ready(self) -> bool:
        return self.holder.ready

    def rebuild(self, force: bool = False) -> bool:
        """Build and swap a snapshot if the view may be served (warm or caught up) and changed."""
        if force:
            self._serving = True
        if not self._serving or not (self.builder.dirty or not self.holder.ready or force):
            return False
        snap = self.holder.swap(self.builder.build(self.clock.now()))
        self.metrics.snapshot_nodes.set(len(snap.nodes))
        self.metrics.snapshot_models.set(len(snap.models))
        return True

    # -- verbs
    def _decide(self, verb: str, pod_raw: dict[str, Any], nodes: list[str]) -> tuple[PodInfo, Decision]:
        try:
            pod = pod_info(pod_raw)
        except PodError as exc:
            raise ProtocolError(str(exc)) from None
        now = self.clock.now()
        d = decide(self.holder.current, pod, nodes, self.assumed, self.params, now)
        if d.neutral is not None and not d.stale:
            self.metrics.unlabeled_pods.labels(verb).inc()
        self._note_staleness(d)
        return pod, d

    def _note_staleness(self, d: Decision) -> None:
        reason = d.neutral if d.stale else None
        if reason is not None:
            self.metrics.stale_answers.labels(reason).inc()
        if d.neutral is not None and not d.stale:
            return  # an unlabeled pod says nothing about the data
        if reason != self._stale_reason:
            if reason is not None:
                log.warning("no fresh data (%s): answering neutral (all pass, score 5) until it returns", reason)
            else:
                log.info("fresh data again: scoring with predictions")
            self._stale_reason = reason

    def filter(self, args: ExtenderArgs) -> dict[str, Any]:
        """ExtenderFilterResult for one request."""
        _, d = self._decide("filter", args.pod, args.node_names)
        failed = d.failed_nodes()
        for reason in failed.values():
            self.metrics.failed_nodes.labels("anti_affinity" if reason.startswith("anti-affinity") else "sla").inc()
        if d.sla_relaxed and d.pod.app:
            self.metrics.sla_relaxed.labels(d.pod.app).inc()
        return filter_result(args, failed)

    def prioritize(self, args: ExtenderArgs) -> list[dict[str, Any]]:
        """HostPriorityList for one request; assumes the top node and queues the predictions."""
        pod, d = self._decide("prioritize", args.pod, args.node_names)
        if d.neutral is None and pod.app is not None:
            now = self.clock.now()
            self.metrics.scored_pods.labels(pod.app).inc()
            best = d.best()
            if best is not None:
                self.assumed.assume(pod.task_id, pod.app, best, now)
            if self.publisher is not None:
                self.publisher.offer(d, now)
        return priority_list(d.scores())

    # -- lifecycle
    async def start(self) -> None:
        if self._redis_on:
            import redis.asyncio as aioredis

            self._redis = aioredis.from_url(self.settings.redis_url)
            await self._warm_start()
            refresher = RunningRefresher(self._redis, self.keys, self.builder, self.options.running_refresh_s,
                                         on_change=self.rebuild, now=self.clock.now)
            self._tasks.append(asyncio.get_running_loop().create_task(refresher.run(), name="running-refresh"))
        if self._kafka:
            self.feed = ViewFeed(self.settings, self.builder, self._model_loader(), self.metrics,
                                 rebuild=lambda: self.rebuild(force=True),
                                 rebuild_interval_s=self.options.rebuild_interval_s, on_model=self._cache_model,
                                 on_completion=self.assumed.forget)
            await self.feed.start()
        if self._publish:
            sink = self._sink
            if sink is None:
                kafka_sink = KafkaSink(self.settings, self.metrics)
                await kafka_sink.start()
                sink = kafka_sink
            self.publisher = PredictionPublisher(sink, self.metrics, self.options.publish_queue)
            self.publisher.start()

    def _model_loader(self) -> ModelLoader:
        if self._loader is None:
            from app.extender.models import registry_loader

            self._loader = registry_loader(self.settings)
        return self._loader

    async def _warm_start(self) -> None:
        loader = self._model_loader()

        async def load(update: Any) -> bool:
            return await install_model(update, loader, self.builder, self.metrics)

        try:
            result = await asyncio.wait_for(
                warm_start(self._redis, self.keys, self.builder, load), self.options.warm_timeout_s)
        except Exception as exc:  # Redis down or slow: the Kafka feed will make us ready
            log.warning("warm start from redis skipped: %s", exc)
            return
        if result.usable:
            self.rebuild(force=True)

    async def _cache_model(self, update: Any) -> None:
        if self._redis is not None:
            await store_model_update(self._redis, self.keys, update)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        if self.feed is not None:
            await self.feed.stop()
            self.feed = None
        if self.publisher is not None:
            await self.publisher.stop()
            self.publisher = None
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None
