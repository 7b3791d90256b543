"""The models a worker predicts with: hot-swapped on model-updates, sha256 verified, no restart.

Every worker needs every model (its nodes may be of any class and run any app), so model-updates is read
without a consumer group: all partitions, from the beginning (the topic is compacted: the first pass is
the current version of every key). A message whose version is newer than the one in use is loaded
from the registry (:func:`app.registry.store.load_predictor`: the blob's sha256 is checked against its
record) off the event loop; the record's sha256 must also be the one the message announced. A model
that cannot be loaded or verified is counted and skipped: the previous version keeps serving.

An app retired from the worker (no message named it for ``RTT_NODE_EVICT_AFTER_S``:
:mod:`app.streams.eviction`) has its models unloaded (:meth:`ModelCache.park`): what is kept of each key is
the newest update announced for it (key, version, sha256), and updates announced while the app is retired
only replace that. When the app is named again, :meth:`ModelCache.unpark` hands those updates back and the
worker loads them from the registry as any update (sha256 checked, retried while the registry is away);
until each is loaded or rejected, :meth:`ModelCache.has` still says the key has a model, so no cold start is
asked for it.

A tombstone (a message without value) does not delete a model: deleting one is not supported, so the
key's model keeps serving; it is counted (``rtt_worker_model_rejected_total{reason="tombstone"}``) and logged
at INFO.

When the registry cannot be reached (Redis away: :class:`~app.model.errors.RegistryUnavailableError`),
the update is kept and tried again with backoff (up to ``RTT_RETRY_MAX_BACKOFF_S`` between tries) until
it loads or a newer version of the key supersedes it; meanwhile the worker serves with what it has and
reports itself degraded (``rtt_worker_degraded{reason="model_store"}`` = 1, and ``/readyz``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError, OffsetOutOfRangeError

from app.config import Settings
from app.contracts import contract, decode
from app.contracts.admission import check_key
from app.contracts.keys import parse_model_key
from app.errors import ContractError, RttError
from app.kafka.client import consumer_options
from app.kafka.positions import PositionGuard
from app.model.errors import RegistryUnavailableError
from app.model.fast import FastPredictor
from app.registry.base import ModelRecord, ModelStore
from app.registry.store import load_predictor, open_store
from app.retry import Backoff
from app.streams.health import Health
from app.streams.metrics import WorkerMetrics

log = logging.getLogger(__name__)
DEGRADED_REASON = "model_store"
TOMBSTONE = "tombstone"  # the reason a model-updates message without value is counted under
RETRY_S = 1.0  # pause after a broker error before model-updates are read again


class ModelCache:
    """Predictors in use, by model key; :meth:`apply` swaps one in when an update is newer and verified.

    Parameters
    ----------
    store
        The registry (opened lazily from ``settings`` by default: opening may touch the network).
    metrics, health
        The worker app's series and degraded reasons (fresh ones by default).

    ``on_swap`` callbacks get ``(model_key, version)`` after each swap.
    """

    def __init__(self, settings: Settings, store: ModelStore | None = None,
                 opener: Callable[[Settings], ModelStore] = open_store, *, metrics: WorkerMetrics | None = None,
                 health: Health | None = None) -> None:
        self.settings = settings
        self.metrics = metrics if metrics is not None else WorkerMetrics()
        self.health = health if health is not None else Health(self.metrics.registry)
        self._store = store
        self._opener = opener
        self.models: dict[str, tuple[FastPredictor, ModelRecord]] = {}
        self.on_swap: list[Callable[[str, int], None]] = []
        self.pending: dict[str, dict[str, Any]] = {}  # key -> newest update that could not be loaded yet
        self.retired: set[str] = set()  # apps with parked keys: their updates are parked too, not loaded
        self.parked: dict[str, dict[str, Any]] = {}  # key of a retired app -> newest update announced (not loaded)
        self.returning: set[str] = set()  # keys handed back by unpark, not loaded or rejected yet
        self.backoff = Backoff.upto(settings.retry_max_backoff_s)
        self._retry: asyncio.Task[None] | None = None

    @property
    def store(self) -> ModelStore:
        if self._store is None:
            self._store = self._opener(self.settings)
        return self._store

    def version(self, key: str) -> int | None:
        m = self.models.get(key)
        return m[1].version if m is not None else None

    def has(self, key: str) -> bool:
        """Whether ``key`` has a model in use, or one being loaded again for its returning app."""
        return key in self.models or key in self.returning

    def predictor(self, key: str) -> FastPredictor | None:
        m = self.models.get(key)
        return m[0] if m is not None else None

    def feature_names(self, app: str) -> frozenset[str]:
        """Every feature name some model of ``app`` reads."""
        return frozenset(n for key, (p, _) in self.models.items() if parse_model_key(key)[0] == app
                         for n in p.feature_names)

    def keys_for_class(self, node_class: str) -> dict[str, str]:
        """``{app: model key}`` of the per-class models of ``node_class``."""
        out = {}
        for key in self.models:
            app, cls, node = parse_model_key(key)
            if cls == node_class and node is None:
                out[app] = key
        return out

    def apps(self) -> set[str]:
        """Apps with a model loaded."""
        return {parse_model_key(key)[0] for key in self.models}

    def park(self, apps: set[str] | frozenset[str]) -> list[str]:
        """Unload every model of ``apps`` (retired), keeping the newest update of each key (loaded or still
        waiting for the registry) for :meth:`unpark`; the keys unloaded."""
        unloaded = []
        for key in [k for k in self.models if parse_model_key(k)[0] in apps]:
            _, record = self.models.pop(key)
            self._park_update({"model_key": key, "version": record.version, "sha256": record.sha256})
            with contextlib.suppress(KeyError):
                self.metrics.feedback.model_version.remove(key)
            unloaded.append(key)
        for key in [k for k in self.pending if parse_model_key(k)[0] in apps]:
            self._park_update(self.pending.pop(key))
        self.returning = {k for k in self.returning if parse_model_key(k)[0] not in apps}
        if not self.pending:
            self.health.recovered(DEGRADED_REASON)
        return unloaded

    def unpark(self, app: str) -> list[dict[str, Any]]:
        """``app`` is named again: the updates of its parked keys, to be applied (loaded) again."""
        if app not in self.retired:
            return []
        self.retired.discard(app)
        keys = [k for k in self.parked if parse_model_key(k)[0] == app]
        self.returning.update(keys)
        return [self.parked.pop(k) for k in keys]

    def _park_update(self, update: dict[str, Any]) -> None:
        key, version = update["model_key"], int(update["version"])
        self.retired.add(parse_model_key(key)[0])
        kept = self.parked.get(key)
        if kept is None or int(kept["version"]) < version:
            self.parked[key] = {"model_key": key, "version": version, "sha256": update["sha256"]}

    def _retired(self, update: dict[str, Any]) -> bool:
        """Park ``update`` if its app is retired; whether it was."""
        key = update["model_key"]
        if parse_model_key(key)[0] not in self.retired:
            return False
        self._park_update(update)
        waiting = self.pending.pop(key, None)
        if waiting is not None:
            self._park_update(waiting)
        if not self.pending:
            self.health.recovered(DEGRADED_REASON)
        return True

    def _load(self, key: str, version: int, sha256: str) -> tuple[FastPredictor, ModelRecord]:
        predictor, record = load_predictor(self.store, key, version)
        if record.sha256 != sha256:
            raise ContractError("sha256_mismatch", f"{key} v{version}: registry {record.sha256}, update {sha256}")
        return predictor, record

    async def apply(self, update: dict[str, Any]) -> bool:
        """Swap in the update's model if it is newer than the one in use; False if skipped, rejected or deferred.

        Deferred: the registry is unavailable; the update is retried in the background (:meth:`retry_pending`).
        """
        key, version = update["model_key"], int(update["version"])
        waiting = self.pending.get(key)
        if waiting is not None and int(waiting["version"]) >= version:
            return False
        return await self._try(update)

    async def _try(self, update: dict[str, Any]) -> bool:
        key, version = update["model_key"], int(update["version"])
        if self._retired(update):
            return False
        current = self.version(key)
        if current is not None and current >= version:
            self.pending.pop(key, None)
            self.returning.discard(key)
            return False
        loop = asyncio.get_running_loop()
        try:
            loaded = await loop.run_in_executor(None, self._load, key, version, update["sha256"])
        except RegistryUnavailableError as exc:
            if not self._retired(update):
                self._defer(update, exc)
            return False
        except (RttError, ValueError, OSError) as exc:
            self.pending.pop(key, None)
            self.returning.discard(key)
            if not self.pending:
                self.health.recovered(DEGRADED_REASON)
            reason = getattr(exc, "reason", type(exc).__name__)
            self.metrics.feedback.model_rejected.labels(reason).inc()
            log.warning("model %s v%d not loaded (%s): keeping v%s", key, version, exc, current)
            return False
        if self._retired(update):  # its app was retired while this loaded
            return False
        self.pending.pop(key, None)
        self.returning.discard(key)
        if not self.pending:
            self.health.recovered(DEGRADED_REASON)
        if (self.version(key) or 0) >= version:  # a newer one landed while this loaded
            return False
        self.models[key] = loaded
        self.metrics.feedback.model_version.labels(key).set(version)
        for callback in self.on_swap:
            callback(key, version)
        log.info("model %s: now v%d (was v%s)", key, version, current)
        return True

    def tombstone(self, key: bytes | None, where: str) -> None:
        """Count a model-updates tombstone of ``key`` read at ``where``; the key's model keeps serving."""
        name = key.decode("utf-8", "replace") if key is not None else None
        version = self.version(name) if name is not None else None
        self.metrics.feedback.model_rejected.labels(TOMBSTONE).inc()
        log.info("model-updates tombstone of %r at %s: deleting a model is not supported (%s)", name, where,
                 f"v{version} keeps serving" if version is not None else "no model of it in use")

    def _defer(self, update: dict[str, Any], exc: Exception) -> None:
        key = update["model_key"]
        first = key not in self.pending
        self.pending[key] = update
        self.metrics.feedback.model_retries.inc()
        self.health.degraded(DEGRADED_REASON, str(exc))
        if first:
            log.warning("model %s v%d not loaded yet (%s): keeping v%s, retrying with backoff", key,
                        int(update["version"]), exc, self.version(key))
        if self._retry is None or self._retry.done():
            self._retry = asyncio.get_running_loop().create_task(self.retry_pending(), name="model-retry")

    async def retry_pending(self) -> None:
        """Try the deferred updates again, with backoff, until each loaded or was superseded."""
        while self.pending:
            await asyncio.sleep(self.backoff.next())
            for update in list(self.pending.values()):
                await self._try(update)
        self.backoff.reset()

    async def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._retry


async def follow_model_updates(settings: Settings, cache: ModelCache, started: asyncio.Event | None = None) -> None:
    """Apply every model-updates message, from the beginning of every partition, until cancelled.

    A broker error is logged and waited out (``RETRY_S``), never the end of the task. A fetched batch is applied
    even when the check of the read positions after it (:meth:`PositionGuard.after_fetch`) fails: the consumer's
    positions have already moved past it, so a batch left unapplied would never be read again.
    """
    topic = settings.topic("model-updates")
    consumer = AIOKafkaConsumer(**consumer_options(settings, group_id=None, enable_auto_commit=False,
                                                   auto_offset_reset="none"))
    await consumer.start()
    guard = PositionGuard(consumer, "worker-model-updates", topic_label=lambda _t: "model-updates",
                          registry=cache.metrics.registry)
    try:
        tps = [TopicPartition(topic, p) for p in range(contract("model-updates").partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        if started is not None:
            started.set()
        while True:
            try:
                try:
                    batches = await consumer.getmany(timeout_ms=500)
                except OffsetOutOfRangeError as exc:  # the reset's own broker error goes to the handler below
                    await guard.out_of_range(exc.args[0])
                    continue
            except KafkaError as exc:  # broker away (reading, or resetting a position): try again, never end the task
                log.warning("model-updates: %r; retrying", exc)
                await asyncio.sleep(RETRY_S)
                continue
            guard.note(batches)
            try:
                await guard.after_fetch()
                checked = True
            except KafkaError as exc:  # the positions have moved past the batch: it is applied all the same
                log.warning("model-updates: read positions not checked (%r); retrying", exc)
                checked = False
            await _apply_batch(cache, batches)
            if not checked:  # the next fetch checks again
                await asyncio.sleep(RETRY_S)
    finally:
        await cache.close()
        with contextlib.suppress(Exception):
            await consumer.stop()


async def _apply_batch(cache: ModelCache, batches: dict[TopicPartition, list[Any]]) -> None:
    """Apply each model-updates message of a fetched batch, in order; a tombstone or a bad message is counted."""
    for records in batches.values():
        for rec in records:
            if rec.value is None:
                cache.tombstone(rec.key, f"{rec.topic}:{rec.offset}")
                continue
            try:
                update = decode("model-updates", rec.value)
                check_key("model-updates", rec.key, update)
            except ContractError as exc:  # read from the start by every worker: counted and logged here
                cache.metrics.feedback.model_rejected.labels(exc.reason).inc()
                log.warning("bad model-update at %s:%d: %s", rec.topic, rec.offset, exc)
                continue
            await cache.apply(update)
