"""Every error period: node-weights of the nodes this worker holds, and the latest view in Redis.

A node's value: ``weight`` (its :class:`~app.drift.credibility.Credibility`; ``settings.credibility_prior``
for a node never evaluated), ``correction`` and ``samples`` per app (the residual factor and the completed
tasks of :meth:`~app.drift.tracker.NodeTracker.weights_fields`), ``predicted_rtt_ms`` per app (the current
model of ``app:node_class`` on the node's current features over the app's DWA window, with its hardware
descriptors; task size unknown; before the correction), and ``stale`` when its newest metrics are older
than ``stale_after_scrapes × scrape_interval_s``.
Predictions are made one model at a time over all the nodes of its class (one kernel call each).

When ``settings.redis_url`` is set, the same node-weights values and each node's latest node-features
value are written to the extender's cache (:class:`~app.scheduler.cache.CacheKeys`) in one pipelined
batch, by a background task: the timer never waits on Redis, and a batch still running when the next
period comes makes that period skip its write (counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Container
from typing import Any

import faust
import numpy as np
import orjson
from mode import Service

from app.contracts import encode
from app.features.hardware import hardware_features, node_counts
from app.features.vector import TASK_FEATURES, matrix
from app.masking import mask_url
from app.redis_client import async_redis_client
from app.scheduler.cache import CacheKeys
from app.streams.context import context_of
from app.streams.feedback_metrics import FeedbackMetrics
from app.streams.feedback_state import FeedbackLoop
from app.streams.health import Health
from app.streams.node_state import NodeState
from app.streams.timers import timer
from app.streams.topics import contract_topic, track_delivery

log = logging.getLogger(__name__)

MAX_RTT_MS = 1e12


def predict_nodes(loop: FeedbackLoop, states: list[NodeState]) -> dict[str, dict[str, float]]:
    """``{node: {app: predicted RTT ms}}`` with the current per-class models."""
    out: dict[str, dict[str, float]] = {s.node: {} for s in states}
    by_class: dict[str, list[NodeState]] = {}
    for s in states:
        by_class.setdefault(s.node_class, []).append(s)
    for node_class, members in by_class.items():
        for app, key in loop.models.keys_for_class(node_class).items():
            predictor = loop.models.predictor(key)
            if predictor is None:
                continue
            rows = []
            for s in members:
                tracker = loop.trackers.get(s.node)
                window = tracker.window(app) if tracker is not None else s.window.window_s
                values = s.window.aggregate(window_s=window).features()
                values.update(hardware_features(node_class, s.gpu_model, *node_counts(values)))
                values[TASK_FEATURES[0]] = math.nan
                rows.append(values)
            predicted = predictor.predict(matrix(rows, predictor.feature_names))
            for s, y in zip(members, predicted.tolist(), strict=True):
                if math.isfinite(y):
                    out[s.node][app] = float(np.clip(y, 0.0, MAX_RTT_MS))
    return out


def weights_values(loop: FeedbackLoop, now: float) -> list[dict[str, Any]]:
    """The node-weights value of every node with metrics this worker holds."""
    s = loop.settings
    stale_after = s.stale_after_scrapes * s.scrape_interval_s
    states = [st for st in loop.nodes.store.states.values() if st.newest_ts > 0]
    predicted = predict_nodes(loop, states)
    out = []
    for st in states:
        tracker = loop.trackers.get(st.node)
        fields = tracker.weights_fields() if tracker is not None else {"weight": s.credibility_prior}
        out.append({"node": st.node, "ts": now, **fields, "predicted_rtt_ms": predicted[st.node],
                    "stale": now - st.newest_ts > stale_after, "node_class": st.node_class,
                    "gpu_model": st.gpu_model})
    return out


async def send_held(values: list[dict[str, Any]], held: Container[str],
                    send: Callable[[dict[str, Any]], Awaitable[None]], lock: asyncio.Lock) -> int:
    """Send each value whose node is still ``held``; values sent.

    A value is checked and sent under ``lock``, which eviction holds while it sends its tombstones: a node
    evicted while the period is being sent is skipped, and one evicted after its value went out gets its
    tombstone after it. (Checking outside the lock lost that race: the send yields to the event loop before
    the message is queued, and an eviction in between queued the tombstone first.)
    """
    sent = 0
    for v in values:
        async with lock:
            if v["node"] not in held:
                continue  # evicted while this period was being sent: its tombstone must stay the last word
            await send(v)
            sent += 1
    return sent


class RedisWriter:
    """Best-effort batched writes of the latest values; one batch in flight at most (counted in ``metrics``,
    a failure reported to ``health``)."""

    def __init__(self, url: str, prefix: str, timeout_s: float, metrics: FeedbackMetrics, health: Health) -> None:
        self.client = async_redis_client(url, timeout_s)  # a Redis that never answers: each call gives up
        self.where = f"Redis at {mask_url(url)} (REDIS_URL)"  # what a failure names: the address, its setting
        self.writes = metrics.redis_writes
        self.health = health
        self.keys = CacheKeys(prefix)
        self.timeout_s = timeout_s
        self.closed = False  # by close(): nothing more is written, its client not opened again
        self._task: asyncio.Task[None] | None = None

    def submit(self, features: list[dict[str, Any]], weights: list[dict[str, Any]]) -> bool:
        if self.closed:  # a period that ends as the worker stops
            return False
        if self._task is not None and not self._task.done():
            self.writes.labels("skipped").inc()
            return False
        items = [(self.keys.features(v["node"]), orjson.dumps(v)) for v in features]
        items += [(self.keys.weights(v["node"]), orjson.dumps(v)) for v in weights]
        self._task = asyncio.get_running_loop().create_task(self._write(items))
        return True

    async def _write(self, items: list[tuple[str, bytes]]) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)
            for key, value in items:
                pipe.set(key, value)
            await asyncio.wait_for(pipe.execute(), self.timeout_s)
            self.writes.labels("ok").inc()
            self.health.recovered("redis_cache")
        except Exception as exc:  # best effort: the next period writes the latest values again
            self.writes.labels("failed").inc()
            self.health.degraded("redis_cache", f"redis cache write to {self.where} failed: {exc!r}")

    async def forget(self, nodes: list[str]) -> None:
        """Delete the cached values of evicted ``nodes`` (a restarted extender would warm up with them, and
        ``rttsched publish`` count them as nodes with metrics); best effort, like the writes."""
        keys = [k for n in nodes for k in (self.keys.features(n), self.keys.weights(n))]
        if not keys or self.closed:
            return
        try:
            await asyncio.wait_for(self.client.delete(*keys), self.timeout_s)
            self.writes.labels("ok").inc()
        except Exception as exc:  # the key then lives on in Redis until the next eviction of the node
            self.writes.labels("failed").inc()
            self.health.degraded("redis_cache", f"redis cache delete at {self.where} failed: {exc!r}")

    async def close(self) -> None:
        """Wait for the batch in flight (``timeout_s`` at most) and close the client's connections."""
        self.closed = True
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, self.timeout_s)
        try:
            await self.client.aclose()
        except Exception as exc:  # its connections are gone with the process all the same
            log.debug("closing the redis cache client at %s failed: %r", self.where, exc)


def register_weights(app: faust.App, loop: FeedbackLoop) -> None:
    """Add the node-weights timer (and the Redis writer when ``redis_url`` is set) to ``app``."""
    settings = loop.settings
    topic = contract_topic(app, settings, "node-weights")
    writer: list[RedisWriter] = []
    out, node_weight = loop.metrics.messages_out.labels("node-weights"), loop.metrics.feedback.node_weight
    lost = loop.metrics.send_failures.labels("node-weights", "dropped")

    lock = context_of(app).weights_lock
    shown: set[str] = set()  # nodes with a node-weight series on this worker's /metrics

    async def send(v: dict[str, Any]) -> None:
        node_weight.labels(v["node"]).set(v["weight"])
        track_delivery(await topic.send(key=v["node"].encode(), value=encode("node-weights", v, check=False)),
                       f"node-weights of {v['node']} (the next period sends it again)", delivered=out, failed=lost)

    @timer(app, settings.error_period_s, "feedback-weights")
    async def node_weights() -> None:
        now = loop.clock.now()
        values = weights_values(loop, now)
        states = loop.nodes.store.states
        await send_held(values, states, send, lock)
        held = {v["node"] for v in values if v["node"] in states}
        for node in shown - held:  # revoked to another worker, or evicted: its series goes, not frozen
            with contextlib.suppress(KeyError):
                node_weight.remove(node)
        shown.clear()
        shown.update(held)
        if settings.redis_url:
            if not writer:
                timeout_s = loop.options.feedback_redis_timeout_s
                writer.append(RedisWriter(settings.redis_client_url, settings.topic_prefix, timeout_s,
                                          loop.metrics.feedback, loop.health))
            values = [v for v in values if v["node"] in states]
            features = [states[v["node"]].features_value(loop.nodes.store.app_names) for v in values]
            writer[0].submit(features, values)

    loop.handles["weights_values"] = weights_values
    loop.handles["redis_writer"] = writer
    app.add_dependency(WriterClose(writer))


class WriterClose(Service):
    """Closes the worker's Redis writer, if it made one, as its app stops: a child of the app, stopped after
    Faust's own stop (consumer stopped, producer flushed) and before its timers are cancelled (a period that ends
    after it writes nothing)."""

    def __init__(self, writers: list[RedisWriter]) -> None:
        super().__init__()
        self.writers = writers

    async def on_stop(self) -> None:
        for writer in self.writers:
            await writer.close()
