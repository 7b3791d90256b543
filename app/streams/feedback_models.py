"""The models a worker predicts with: hot-swapped on model-updates, sha256 verified, no restart.

Every worker needs every model (its nodes may be of any class and run any app), so model-updates is read
without a consumer group: all partitions, from the beginning (the topic is compacted: the first pass is
the current version of every key). A message whose version is newer than the one in use is loaded
from the registry (:func:`app.registry.store.load_predictor`: the blob's sha256 is checked against its
record) off the event loop; the record's sha256 must also be the one the message announced. A model
that cannot be loaded or verified is counted and skipped: the previous version keeps serving. Of the versions
of a key read together (a first pass, a fetched batch), the newest is tried first; an older one is tried (and
warned about if it fails too) only when every newer one was rejected, so a bad newest version leaves the newest
good one serving, and the versions a good newest one superseded are neither loaded nor warned about.

An app retired from the worker (no message named it for ``RTT_NODE_EVICT_AFTER_S``:
:mod:`app.streams.eviction`) has its models unloaded (:meth:`ModelCache.park`): what is kept of each key is
the newest update announced for it (key, version, sha256), and updates announced while the app is retired
only replace that. When the app is named again, :meth:`ModelCache.unpark` hands those updates back and the
worker loads them from the registry as any update (sha256 checked, retried while the registry is away);
until each is loaded or rejected, :meth:`ModelCache.has` still says the key has a model, so no cold start is
asked for it.

At start (and after every restart) no cold start is asked before the models announced are in use: until
model-updates has been read to the end of every partition (its position at the fetch high watermark) and the
loads that read started have resolved (loaded or rejected; one deferred while the registry is away is not
resolved), :meth:`ModelCache.settled` is False and the worker asks no cold start. The wait is bounded by
``START_BOUND_S`` (30 s) from the start of the read (from the cache's creation if reading never starts): a
broker that never answers, or a registry that stays away, holds cold starts that long, not for good (one
WARNING when it passes). Updates read during that first pass are kept per key and loaded as soon as the
partitions they were read from have been read to their end (the rest when the bound passes), newest first, so
the versions a later one superseded (those the registry trimmed: ``RTT_MODEL_KEEP``) are not loaded; a
partition that never reads to its end holds back only its own keys and the cold starts, not the models of the
others. A key whose update is kept or waiting for the registry counts as having a model (:meth:`ModelCache.has`).

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
import time
from collections.abc import Callable, Iterable
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
from app.kafka.starting import start_or_close
from app.model.errors import RegistryUnavailableError
from app.model.fast import FastPredictor
from app.registry.base import ModelRecord, ModelStore
from app.registry.store import load_predictor, open_store
from app.retry import Backoff
from app.streams.health import Health
from app.streams.intake import StartWait
from app.streams.metrics import WorkerMetrics

log = logging.getLogger(__name__)
DEGRADED_REASON = "model_store"
TOMBSTONE = "tombstone"  # the reason a model-updates message without value is counted under
RETRY_S = 1.0  # pause after a broker error before model-updates are read again
START_BOUND_S = 30.0  # longest wait (s) for the first pass over model-updates before cold starts are asked


class ModelCache:
    """Predictors in use, by model key; :meth:`apply` swaps one in when an update is newer and verified.

    Parameters
    ----------
    store
        The registry (opened lazily from ``settings`` by default: opening may touch the network).
    metrics, health
        The worker app's series and degraded reasons (fresh ones by default).

    start_bound_s
        Longest wait, from the start of the read, for the first pass over model-updates and its loads before
        :meth:`settled` says cold starts may be asked (0: no wait, for a cache no model-updates feed follows).
    clock
        Monotonic seconds, for that bound.

    ``on_swap`` callbacks get ``(model_key, version)`` after each swap.
    """

    def __init__(self, settings: Settings, store: ModelStore | None = None,
                 opener: Callable[[Settings], ModelStore] = open_store, *, metrics: WorkerMetrics | None = None,
                 health: Health | None = None, start_bound_s: float = START_BOUND_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not start_bound_s >= 0:
            raise ValueError(f"start_bound_s must be >= 0 (got {start_bound_s})")
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
        self.start_bound_s = float(start_bound_s)
        self._clock = clock
        self._since = clock()  # the start of the first pass (of the cache until reading starts)
        self.first_pass = True  # model-updates not read to their end since the start yet (nor the bound passed)
        self.held: dict[str, list[dict[str, Any]]] = {}  # key -> its updates read in the first pass, not applied yet
        self._held_from: dict[str, set[int]] = {}  # key -> the partitions its held updates were read from
        self.partitions: set[int] = set()  # the partitions of model-updates the first pass reads
        self.read: set[int] = set()  # those read to their end in the first pass
        self.older: dict[str, list[dict[str, Any]]] = {}  # key -> versions read older than the one being tried,
        # newest first: tried in turn only if every newer one is rejected
        self._settled = start_bound_s == 0

    @property
    def store(self) -> ModelStore:
        if self._store is None:
            self._store = self._opener(self.settings)
        return self._store

    def version(self, key: str) -> int | None:
        m = self.models.get(key)
        return m[1].version if m is not None else None

    def has(self, key: str) -> bool:
        """Whether ``key`` has a model in use, or one announced and not loaded yet: read in the first pass,
        waiting for the registry, to be tried after a newer one was rejected, or being loaded again for its
        returning app."""
        return (key in self.models or key in self.returning or key in self.held or key in self.pending
                or key in self.older)

    def begin_read(self, partitions: Iterable[int] = ()) -> None:
        """The first pass over model-updates (of ``partitions``) starts now: the bound of :meth:`settled` counts
        from here."""
        self._since = self._clock()
        self.partitions = set(partitions)

    def overdue(self) -> bool:
        """Whether the first pass has taken longer than ``start_bound_s``."""
        return self._clock() - self._since >= self.start_bound_s

    def settled(self) -> bool:
        """Whether cold starts may be asked: the first pass over model-updates has ended and every load it
        started has resolved, or ``start_bound_s`` has passed since it started. Once True, always True."""
        if self._settled:
            return True
        if not self.first_pass and not self.pending:
            self._settled = True
            log.info("model-updates read at start: %d model(s) in use; cold starts are asked from now on",
                     len(self.models))
        elif self.overdue():
            self._settled = True
            unread = sorted(self.partitions - self.read)
            log.warning("model-updates %s within %.0f s of start: cold starts are asked from now on (%d model(s)"
                        " in use, %d waiting for the registry)",
                        (f"not read to their end (partition(s) {', '.join(map(str, unread))})" if unread else
                         "not read to their end") if self.first_pass else "read, but not every model loaded",
                        self.start_bound_s, len(self.models), len(self.pending))
        return self._settled

    def holds(self, key: str, partition: int) -> bool:
        """Whether an update of ``key`` read from ``partition`` is to be kept (:meth:`hold`), not applied now: in
        the first pass, until its partition is read to its end, or while an update of its key is kept."""
        return self.first_pass and (partition not in self.read or key in self.held)

    def hold(self, update: dict[str, Any], partition: int | None = None) -> None:
        """Keep ``update``, read from ``partition`` in the first pass, until that partition has been read to its
        end (:meth:`partitions_read`; without a partition: until :meth:`end_first_pass`)."""
        key = update["model_key"]
        kept = self.held.setdefault(key, [])
        kept.append(update)
        if len(kept) > self.settings.model_keep + 1:  # the newest and the older ones :meth:`_keep_older` keeps
            kept.remove(min(kept, key=lambda u: int(u["version"])))
        if partition is not None:
            self._held_from.setdefault(key, set()).add(partition)

    async def partitions_read(self, partitions: Iterable[int]) -> None:
        """``partitions`` have been read to their end in the first pass: apply the updates kept of the keys read
        from them only; once every partition is, the first pass ends."""
        self.read.update(partitions)
        if self.partitions and self.read >= self.partitions:
            await self.end_first_pass()
            return
        for key in [k for k, parts in self._held_from.items() if parts <= self.read]:
            await self._release(key)

    async def end_first_pass(self) -> None:
        """The first pass over model-updates has ended (or its bound passed): apply what it kept, newest first."""
        while self.held:
            await self._release(next(iter(self.held)))
        self.first_pass = False

    async def _release(self, key: str) -> None:
        updates = self.held.get(key)
        try:
            if updates:
                await self.apply_all(updates)
        finally:  # a key counts as having a model until its updates are applied (loaded, deferred or rejected)
            self.held.pop(key, None)
            self._held_from.pop(key, None)

    async def apply_all(self, updates: Iterable[dict[str, Any]]) -> None:
        """Apply updates read together: of each key the newest version; an older one only if every newer one is
        rejected (:meth:`apply`)."""
        by_key: dict[str, list[dict[str, Any]]] = {}
        for update in updates:
            by_key.setdefault(update["model_key"], []).append(update)
        for key, versions in by_key.items():
            newest = max(versions, key=lambda u: int(u["version"]))
            self._keep_older(key, [u for u in versions if int(u["version"]) < int(newest["version"])])
            await self.apply(newest)

    def _keep_older(self, key: str, updates: Iterable[dict[str, Any]]) -> None:
        """Keep ``updates`` of ``key`` to be tried if the newer ones are rejected: the newest ``model_keep`` (an
        older version is trimmed from the registry), one per version."""
        by_version = {int(u["version"]): u for u in self.older.get(key, [])}
        by_version.update((int(u["version"]), u) for u in updates)
        if by_version:
            self.older[key] = [by_version[v] for v in sorted(by_version, reverse=True)[:self.settings.model_keep]]

    def _next_older(self, key: str, below: int) -> dict[str, Any] | None:
        """The newest update of ``key`` kept by :meth:`_keep_older` older than ``below`` and newer than the version
        in use (taken from those kept), or None (nothing of the key is kept then)."""
        floor = self.version(key) or 0
        left = [u for u in self.older.pop(key, []) if floor < int(u["version"]) < below]
        if not left:
            return None
        if left[1:]:
            self.older[key] = left[1:]
        return left[0]

    def _drop_older(self, key: str, upto: int) -> None:
        """Forget the versions of ``key`` kept to be tried that are not newer than ``upto`` (the one in use)."""
        left = [u for u in self.older.pop(key, []) if int(u["version"]) > upto]
        if left:
            self.older[key] = left

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
        for key in [k for k in self.held if parse_model_key(k)[0] in apps]:
            updates = self.held.pop(key)
            self._held_from.pop(key, None)
            newest = max(updates, key=lambda u: int(u["version"]))
            self._park_update(newest)  # the older ones: tried once it is handed back, if it is rejected
            self._keep_older(key, [u for u in updates if int(u["version"]) < int(newest["version"])])
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
            if int(waiting["version"]) > version:
                self._keep_older(key, [update])  # tried if the one waiting is rejected
            return False
        return await self._try(update)

    async def _try(self, update: dict[str, Any]) -> bool:
        """Load ``update``; if it is rejected, the next older version kept of its key (:meth:`_keep_older`), and so
        on, until one loads, is deferred, or none is left."""
        while True:
            outcome = await self._try_one(update)
            if not isinstance(outcome, dict):
                return outcome
            update = outcome

    async def _try_one(self, update: dict[str, Any]) -> bool | dict[str, Any]:
        """Load ``update``: True if swapped in, False if skipped or deferred, or the older update of its key to
        try next if it was rejected."""
        key, version = update["model_key"], int(update["version"])
        if self._retired(update):
            return False
        current = self.version(key)
        if current is not None and current >= version:
            self.pending.pop(key, None)
            self.returning.discard(key)
            self._drop_older(key, current)
            return False
        loop = asyncio.get_running_loop()
        try:
            loaded = await loop.run_in_executor(None, self._load, key, version, update["sha256"])
        except RegistryUnavailableError as exc:
            if not self._retired(update):
                self._defer(update, exc)
            return False
        except (RttError, ValueError, OSError) as exc:
            waiting = self.pending.pop(key, None)
            if waiting is not None and int(waiting["version"]) < version:  # an older one deferred: tried next
                self._keep_older(key, [waiting])
            reason = getattr(exc, "reason", type(exc).__name__)
            self.metrics.feedback.model_rejected.labels(reason).inc()
            older = self._next_older(key, version)
            if older is not None:
                log.warning("model %s v%d not loaded (%s): trying v%d", key, version, exc, int(older["version"]))
                return older
            self.returning.discard(key)
            if not self.pending:
                self.health.recovered(DEGRADED_REASON)
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
        self._drop_older(key, version)
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
        if version is not None:
            state = f"v{version} keeps serving"
        elif name is not None and (announced := self._announced(name)) is not None:
            state = f"v{announced} announced serves once loaded"
        else:
            state = "no model of it in use"
        log.info("model-updates tombstone of %r at %s: deleting a model is not supported (%s)", name, where, state)

    def _announced(self, key: str) -> int | None:
        """The newest version of ``key`` read and not loaded yet (kept in the first pass or waiting for the
        registry), or None."""
        versions = [int(u["version"]) for u in self.held.get(key, [])]
        if key in self.pending:
            versions.append(int(self.pending[key]["version"]))
        return max(versions) if versions else None

    def _defer(self, update: dict[str, Any], exc: Exception) -> None:
        key = update["model_key"]
        first = key not in self.pending
        superseded = self.pending.get(key)
        if superseded is not None and int(superseded["version"]) < int(update["version"]):
            self._keep_older(key, [superseded])  # tried if this one is rejected
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

    A broker error, as the consumer starts or reads, is logged and waited out (``RETRY_S``), never the end of the
    task. A fetched batch is applied even when the check of the read positions after it
    (:meth:`PositionGuard.after_fetch`) fails: the consumer's positions have already moved past it, so a batch left
    unapplied would never be read again.
    """
    topic = settings.topic("model-updates")
    wait = StartWait("model-updates", "consumer", health=cache.health)
    while True:  # the broker away as the consumer starts: as while it reads, try again (saying so now and then)
        consumer = AIOKafkaConsumer(**consumer_options(settings, group_id=None, enable_auto_commit=False,
                                                       auto_offset_reset="none"))
        try:
            await start_or_close(consumer)  # closed, whatever ended its start (a cancel too)
            break
        except KafkaError as exc:
            wait.failed(exc)
            await asyncio.sleep(RETRY_S)
    wait.done()
    guard = PositionGuard(consumer, "worker-model-updates", topic_label=lambda _t: "model-updates",
                          registry=cache.metrics.registry)
    try:
        tps = [TopicPartition(topic, p) for p in range(contract("model-updates").partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        cache.begin_read(tp.partition for tp in consumer.assignment())
        if started is not None:
            started.set()
        while True:
            cache.settled()  # logs when cold starts may be asked (the bound's WARNING too), whoever asks or not
            if cache.first_pass and cache.overdue():  # the bound of the first pass: load what it read so far
                await cache.end_first_pass()
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
            if cache.first_pass:
                await cache.partitions_read(await _read_to_end(consumer, guard, batches, cache.read))
            if not checked:  # the next fetch checks again
                await asyncio.sleep(RETRY_S)
    finally:
        await cache.close()
        with contextlib.suppress(Exception):
            await consumer.stop()


async def _read_to_end(consumer: Any, guard: PositionGuard, batches: dict[TopicPartition, list[Any]],
                       known: set[int]) -> set[int]:
    """The assigned partitions not in ``known`` that have been read up to their fetch high watermark (a partition
    no fetch has answered yet has not). A partition answered without records whose position is not known from its
    records (the offsets before the end hold no record the consumer hands out) is asked its position."""
    read = set()
    for tp in consumer.assignment():
        high = consumer.highwater(tp)
        if tp.partition in known or high is None:
            continue
        pos = guard.next_offsets.get(tp)
        if (pos is None or pos < high) and not batches.get(tp):
            pos = guard.next_offsets[tp] = await consumer.position(tp)
        if pos >= high:
            read.add(tp.partition)
    return read


async def _apply_batch(cache: ModelCache, batches: dict[TopicPartition, list[Any]]) -> None:
    """Apply the updates of a fetched batch, newest per key first (in the first pass: keep those of a partition
    not read to its end yet); a tombstone or a bad message is counted."""
    updates, tombstones = [], []
    for records in batches.values():
        for rec in records:
            if rec.value is None:  # logged once the updates beside it are kept or applied
                tombstones.append(rec)
                continue
            try:
                update = decode("model-updates", rec.value)
                check_key("model-updates", rec.key, update)
            except ContractError as exc:  # read from the start by every worker: counted and logged here
                cache.metrics.feedback.model_rejected.labels(exc.reason).inc()
                log.warning("bad model-update at %s:%d: %s", rec.topic, rec.offset, exc)
                continue
            if cache.holds(update["model_key"], rec.partition):
                cache.hold(update, rec.partition)
            else:
                updates.append(update)
    await cache.apply_all(updates)
    for rec in tombstones:
        cache.tombstone(rec.key, f"{rec.topic}:{rec.offset}")
