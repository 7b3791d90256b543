"""The extender's state and verbs, independent of HTTP: view, assumed pods, policy, publisher, feeds.

Handlers call :meth:`ExtenderService.filter`, :meth:`ExtenderService.prioritize` and
:meth:`ExtenderService.prepare_explain`: plain functions that read the current snapshot once, never await
anything and return the answer's JSON (an explanation's contributions are finished off the event loop).
Everything that talks to Kafka or Redis runs in background tasks that :meth:`ExtenderService.start` starts and
returns at once — so the port can serve (neutral answers, ``/readyz`` 503 with the reason) before, and
whatever happens to, Kafka and Redis. Snapshots are rebuilt by one task, in slices
(:mod:`app.extender.pacing`), at most every ``rebuild_interval_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from app.clock import Clock, SystemClock
from app.config import Settings
from app.extender.boosters import BoosterCache, registry_boosters
from app.extender.feed import STOP_TIMEOUT_S, ViewFeed
from app.extender.metrics import AppLabels, Children, ExtenderMetrics
from app.extender.model_retry import Degraded, retrying_loader
from app.extender.models import ModelLoader, install_model, prepare_model_code, registry_loader
from app.extender.options import ExtenderOptions
from app.extender.pacing import release_sliced, run_sliced
from app.extender.protocol import ExtenderArgs, filter_body, priority_body_of
from app.extender.publisher import KafkaSink, PredictionPublisher, Sink
from app.extender.warm import RunningRefresher, warm_start
from app.redis_client import settings_redis
from app.scheduler.assumed import AssumedPods
from app.scheduler.builder import SnapshotBuilder
from app.scheduler.cache import CacheKeys, store_model_update
from app.scheduler.cycle import assume, filter_answer
from app.scheduler.decide import DecideParams, Decision, decide
from app.scheduler.explain import Explanation, prepare
from app.scheduler.policy import Policy, load_policy
from app.scheduler.snapshot import Snapshot, SnapshotHolder
from app.stopping import cancel_within

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
    boosters
        XGBoost boosters for ``/explain`` (default: loaded on demand from the model registry).
    """

    def __init__(
        self, settings: Settings, options: ExtenderOptions | None = None, *, policy: Policy | None = None,
        clock: Clock | None = None, loader: ModelLoader | None = None, sink: Sink | None = None,
        publish: bool = True, kafka: bool = True, redis: bool = True, boosters: BoosterCache | None = None,
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
        self.app_labels = AppLabels([*self.policy.sla_ms, *(a for pair in self.policy.anti_affinity for a in pair)])
        self._scored = Children(self.metrics.scored_pods)  # per app label: bounded by AppLabels
        self._loader = loader
        self.boosters = boosters if boosters is not None else registry_boosters(settings)
        self._sink = sink
        self._publish, self._kafka, self._redis_on = publish, kafka, redis and bool(settings.redis_url)
        self.publisher: PredictionPublisher | None = None
        self.feed: ViewFeed | None = None
        self._redis: Any = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._releasing: set[asyncio.Task[None]] = set()  # old snapshots' node states being freed (_retire)
        self._serving = False
        self._stale_reason: str | None = None
        self._wanted = asyncio.Event()
        self._urgent = asyncio.Event()  # a model arrived: build without waiting out the interval
        self._warming = False
        self.warmed = asyncio.Event()  # set once the Redis warm start is over (or was not attempted)
        self.on_ready: list[Callable[[], object]] = []  # called once, when the first snapshot is installed
        self.metrics.track_snapshot_age(self._age)
        self.degraded = Degraded(self.metrics.registry)

    # -- view
    def _age(self) -> float:
        snap = self.holder.current
        return snap.age(self.clock.now()) if snap is not None else float("inf")

    @property
    def ready(self) -> bool:
        return self.holder.ready

    def readiness(self) -> tuple[bool, str]:
        """Whether the view may be served, and if not, why (what ``/readyz`` says)."""
        if self.holder.ready:
            return True, "ready"
        if self._warming:
            return False, "warm start from Redis in progress"
        if self.feed is not None:
            return False, f"view not caught up: {self.feed.status}"
        return False, "no snapshot yet"

    def rebuild(self, force: bool = False) -> bool:
        """Build and swap a snapshot in one go if the view may be served (warm or caught up) and changed.

        For tests and tools that own the service; a running service rebuilds in the background
        (:meth:`request_rebuild`).
        """
        if not self._should_build(force):
            return False
        self._install(self.builder.build(self.clock.now()))
        return True

    def request_rebuild(self, force: bool = False, *, urgent: bool = False) -> None:
        """Ask the background rebuilder for a new snapshot (``force``: the view may be served from now on;
        ``urgent``: without waiting for ``rebuild_interval_s`` since the last build, for a new model)."""
        if force:
            self._serving = True
        self._wanted.set()
        if urgent:
            self._urgent.set()

    def _should_build(self, force: bool) -> bool:
        if force:
            self._serving = True
        return self._serving and (self.builder.dirty or not self.holder.ready or force)

    def _install(self, snap: Snapshot) -> None:
        first = not self.holder.ready
        old = self.holder.current
        snap = self.holder.swap(snap)
        if old is not None:
            self._retire(old)
        before = old.models if old is not None else {}
        for key, entry in snap.models.items():
            if (prev := before.get(key)) is None or prev.version != entry.version:
                log.info("model %s v%d serving", key, entry.version)
        self.metrics.snapshot_nodes.set(len(snap.nodes))
        self.metrics.snapshot_models.set(len(snap.models))
        self.app_labels.update(key.split(":", 1)[0] for key in snap.models)
        if first:
            for callback in self.on_ready:
                callback()

    def _retire(self, old: Snapshot) -> None:
        """Let go of the snapshot just replaced without freeing its node states in one loop step.

        The states the builder replaced since ``old`` was built are referenced by ``old`` only; they are
        collected in a list here, so that freeing ``old`` costs a dict, and released in slices by a task.
        Without a running loop (a tool that rebuilds synchronously) they are freed at once.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        states: list[object] = list(old.nodes.values())
        task = loop.create_task(release_sliced(states), name="extender-release")
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _rebuilder(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            self._urgent.clear()
            if self._should_build(False):
                try:
                    self._install(await run_sliced(self.builder.build_steps(self.clock.now())))
                except Exception as exc:  # a value the build cannot take: keep serving the last snapshot
                    log.error("snapshot build failed (%r); serving the last one until a build succeeds", exc)
            with contextlib.suppress(TimeoutError):  # at most one build per interval, unless a model arrived
                async with asyncio.timeout(self.options.rebuild_interval_s):  # not wait_for: it can lose a cancel
                    await self._urgent.wait()

    # -- verbs
    def _decide(self, verb: str, args: ExtenderArgs) -> Decision:
        # prioritize decides again before it assumes: what filter predicts is not kept for it (kube-scheduler
        # skips prioritize when one node is feasible; those notes would pile up to max_pods)
        d = decide(self.holder.current, args.pod, args.node_names, self.assumed, self.params, self.clock.now(),
                   note_expected=verb == "prioritize", remember_rows=verb != "prioritize")
        if d.neutral is not None and not d.stale:
            self.metrics.unlabeled_pods.labels(verb).inc()
        self._note_staleness(d)
        return d

    def _note_staleness(self, d: Decision) -> None:
        reason = d.neutral if d.stale else None
        if reason is not None:
            self.metrics.stale_answers.labels(reason).inc()
        if d.neutral is not None and not d.stale:
            return  # an unlabeled pod says nothing about the data
        n = len(d.nodes)
        self.metrics.candidates.inc(n)
        stale = n if d.stale else d.fresh.count(False)  # a stale node among fresh ones scores neutral too
        if stale:
            self.metrics.stale_candidates.inc(stale)
        if reason != self._stale_reason:
            if reason is not None:
                log.warning("no fresh data (%s): answering neutral (all pass, score 5) until it returns", reason)
            else:
                log.info("fresh data again: scoring with predictions")
            self._stale_reason = reason

    def filter(self, args: ExtenderArgs) -> bytes:
        """ExtenderFilterResult for one request (decode it with ``keep_nodes=True`` in NodeList mode)."""
        d = self._decide("filter", args)
        failed = d.failed_nodes()
        for reason in failed.values():
            self.metrics.failed_nodes.labels("anti_affinity" if reason.startswith("anti-affinity") else "sla").inc()
        if d.sla_relaxed and d.pod.app:
            self.metrics.sla_relaxed.labels(self.app_labels.of(d.pod.app)).inc()
        answer = filter_answer(d)
        if answer.bound is not None and d.pod.app:  # kube-scheduler binds a single feasible node without prioritize
            self.metrics.single_node.labels(self.app_labels.of(d.pod.app)).inc()
            self._place(d, d.nodes[answer.bound], answer.bound_expected_s)
        return filter_body(args, failed)

    def prioritize(self, args: ExtenderArgs) -> bytes:
        """HostPriorityList for one request; assumes the top node and queues the predictions."""
        d = self._decide("prioritize", args)
        app = args.pod.app
        if d.neutral is None and app is not None:
            self._scored(self.app_labels.of(app)).inc()
            self._place(d, d.best())
        return priority_body_of(d.nodes, d.score)

    def _place(self, d: Decision, node: str | None, expected_s: float | None = None) -> None:
        """Assume the pod of a scored decision on ``node`` (:func:`app.scheduler.cycle.assume`) and queue its
        predictions, the one for ``node`` marked ``chosen``."""
        now = self.clock.now()
        assume(self.assumed, d, node, now, expected_s)
        if self.publisher is not None:
            self.publisher.offer(d, now, node)

    def prepare_explain(self, args: ExtenderArgs, top: int = 3, method: str = "approx") -> Explanation:
        """Why each candidate gets its score (:func:`app.scheduler.explain.prepare`; changes nothing), but for the
        contributions, which :meth:`Explanation.finish` adds (boosters from the registry, XGBoost): that part
        reads nothing the scheduling verbs change and may run in another thread."""
        return prepare(self.holder.current, args.pod, args.node_names, self.assumed, self.params,
                       self.clock.now(), self.boosters.get, top=top, method=method)

    # -- lifecycle
    async def start(self) -> None:
        """Start the background work and return at once: nothing here waits on Kafka or Redis."""
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._rebuilder(), name="extender-rebuilder"))
        if self._kafka or self._redis_on:  # models will load: their code, before the first one is announced
            self._tasks.append(loop.create_task(asyncio.to_thread(prepare_model_code), name="extender-model-code"))
        if self._redis_on:
            self._warming = True
            self._tasks.append(loop.create_task(self._redis_work(), name="extender-redis"))
        else:
            self.warmed.set()
        if self._kafka:
            self.feed = ViewFeed(self.settings, self.builder, self._feed_loader(), self.metrics,
                                 rebuild=self.request_rebuild, rebuild_interval_s=self.options.rebuild_interval_s,
                                 on_model=self._model_installed, report_s=self.options.report_s, clock=self.clock,
                                 on_completion=self.assumed.forget, degraded=self.degraded)
            self.feed.start()
        if self._publish:
            sink = self._sink if self._sink is not None else KafkaSink(self.settings, self.metrics,
                                                                          report_s=self.options.report_s)
            self.publisher = PredictionPublisher(sink, self.metrics, self.options.publish_queue)
            self.publisher.start()

    def _model_loader(self) -> ModelLoader:
        if self._loader is None:
            self._loader = registry_loader(self.settings)
        return self._loader

    def _feed_loader(self) -> ModelLoader:
        """The model loader of the Kafka feed: registry unavailability retried (:mod:`app.extender.model_retry`)."""

        def superseded(update: Mapping[str, Any]) -> bool:
            have = self.builder.model_version(str(update["model_key"]))
            return have is not None and have >= int(update["version"])

        def waiting(_update: Mapping[str, Any]) -> None:
            if self.feed is not None:
                self.feed.release_current_load()

        return retrying_loader(self._model_loader(), self.degraded, max_backoff_s=self.settings.retry_max_backoff_s,
                               superseded=superseded, on_wait=waiting)

    async def _redis_work(self) -> None:
        self._redis = settings_redis(self.settings)
        try:
            await self._warm_start()
        finally:
            self._warming = False
            self.warmed.set()
        refresher = RunningRefresher(self._redis, self.keys, self.builder, self.options.running_refresh_s,
                                     on_change=self.request_rebuild, now=self.clock.now, degraded=self.degraded,
                                     stale_after_s=self.options.running_stale_s)
        await refresher.run()

    async def _warm_start(self) -> None:
        loader = self._model_loader()

        async def load(update: Any) -> bool:
            return await install_model(update, loader, self.builder, self.metrics)

        try:
            async with asyncio.timeout(self.options.warm_timeout_s):  # not wait_for: a cancel as it ends is kept
                result = await warm_start(self._redis, self.keys, self.builder, load)
        except TimeoutError:  # its str() is empty: say what ran out
            log.warning("warm start from redis skipped: timed out after %gs (RTT_EXTENDER_WARM_TIMEOUT_S); the "
                        "Kafka feed will make the view ready", self.options.warm_timeout_s)
            return
        except Exception as exc:  # Redis down or slow: the Kafka feed will make us ready
            log.warning("warm start from redis skipped: %s", str(exc) or repr(exc))
            return
        if result.usable:
            self.request_rebuild(force=True)

    async def _model_installed(self, update: Any) -> None:
        """A model from model-updates changed the view: serve it now (not after the rebuild interval; before
        the catch-up nothing is built either way), and cache its announcement in Redis."""
        self.request_rebuild(urgent=True)
        if self._redis is not None:
            await store_model_update(self._redis, self.keys, update)

    async def stop(self) -> None:
        """Cancel the background work (``STOP_TIMEOUT_S`` at most for it to end, then it is left behind, named in
        a WARNING), stop the feed and the publisher, close Redis. A cancel of stop() itself while it waits for the
        background work ends that wait: the feed, the publisher and Redis are still closed, then the cancel goes on."""
        try:
            await cancel_within(self._tasks, STOP_TIMEOUT_S, "extender", log)
        finally:
            self._tasks.clear()
            if self._releasing:  # short work, and what it holds should not outlive the service: let it finish
                await asyncio.gather(*self._releasing, return_exceptions=True)
            if self.feed is not None:
                await self.feed.stop()
                self.feed = None
            if self.publisher is not None:
                await self.publisher.stop()
                self.publisher = None
            if self._redis is not None:
                await self._redis.aclose()
                self._redis = None
