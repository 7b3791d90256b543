"""The registry and model-updates kept in agreement (a mixin of :class:`~app.trainer.service.TrainerService`).

A consumer reads model-updates (no group, from the start) for the newest version announced per key (a
tombstone deletes nothing: it is counted as ``rtt_trainer_bad_messages_total{reason="tombstone"}``; a value
that breaks the contract is dead-lettered once, :mod:`app.trainer.dead_letters`); a save always takes a
version above it, so a registry that lost its data (a Redis restarted empty, or from an older snapshot) never
hands out a version the workers and extenders already hold (they would ignore it as old). Every
``registry_check_s`` the trainer compares each key's current version in the registry with the newest
announced: where the registry lost it, its current version (if any) is saved again as a new version and
announced, else a model is trained from the sample history (reason ``registry``); a current version that was
never announced (the trainer stopped in between, or model-updates was recreated empty) is announced once two
checks in a row found it so. A current version whose metadata stays but whose blob is gone (deleted by hand, evicted,
a partial restore; :meth:`~app.trainer.registry.ModelRegistry.blob_missing`, a cheap look for the blob each check)
is a lost model too: no process can load it, so a model is trained from the sample history in its place (reason
``registry``), above every version announced. A lost model is named in one WARNING until what the check finds changes
(another version announced, the registry holding another, or the key found in agreement and then lost again), and
the retrains that cannot replace it yet in one INFO line until what they find changes (their number of samples): a key
with no samples is tried on every check, not logged on every check.

One key whose record cannot be read (:class:`~app.registry.base.CorruptRecordError`: metadata that is not JSON, a
current pointer that is not a number, a Redis key of the wrong type) does not stop the check: the other keys are
checked and repaired; that key is named in one WARNING until what is wrong with it changes (and in an INFO line once
it can be read again), and ``rtt_trainer_degraded{reason="registry_unreadable"}`` is 1 while the last check found
any such key. The registry unavailable (Redis away, a wrong password) ends the check: the
next one tries again; the first check that cannot reach it says so in one WARNING line and sets
``rtt_trainer_degraded{reason="model_store"}`` (the reason of a retrain waiting for the registry: 1 while either the
check or a retrain finds the registry unavailable), and the first check that reaches it again says so in one INFO line
and clears it, unless a retrain still waits. So a trainer with a wrong Redis password is degraded from its first check
(``RTT_REGISTRY_CHECK_S`` after its start), not from its first retrain.

An operator's rollback (``rttsched models rollback``) is a version like any other here: the registry's current
is the version it announced, above every version before it, so the check finds them in agreement; the next
retrain's champion is the registry's current, the rolled-back model.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from app.clock import Clock
from app.contracts import contract, decode
from app.contracts.admission import check_key
from app.errors import ContractError
from app.kafka.batches import partition_for
from app.kafka.positions import PositionGuard
from app.model.errors import RegistryError, RegistryUnavailableError
from app.trainer.dead_letters import TrainerDeadLetters
from app.trainer.metrics import MODEL_STORE, UNREADABLE, TrainerMetrics
from app.trainer.registry import ModelRegistry, update_message

if TYPE_CHECKING:
    from app.kafka.commits import Mark

log = logging.getLogger(__name__)

REGISTRY_LOST = "registry"  # the reason of a retrain the registry check starts


class RegistryAgreement:
    """Reads model-updates and brings the registry back in line with it; the service provides the rest."""

    registry: ModelRegistry
    metrics: TrainerMetrics
    clock: Clock
    dead_letters: TrainerDeadLetters
    registry_check_s: float
    announced: dict[str, tuple[int, str]]  # key -> newest (version, sha256) on model-updates
    _floor: dict[str, int]  # key -> newest version ever seen announced (kept across topic resets)
    _unannounced: dict[str, int]  # key -> current version the last check found not announced
    _unreadable: dict[str, str]  # key -> why the last check could not check it (logged once until it changes)
    _lost: dict[str, list[str]]  # key -> what was said of its lost model: the check's finding, its retrain's (if any)
    _training: set[str]
    _waiting: set[str]  # keys whose retrain waits for the model registry (the service's)
    _check_away: str | None = None  # why the last registry check could not reach the registry; None: it could
    _updates: AIOKafkaConsumer | None
    _update_tps: list[TopicPartition]
    _update_guard: PositionGuard

    if TYPE_CHECKING:  # provided by TrainerService
        async def _fetch(self, consumer: AIOKafkaConsumer, guard: PositionGuard,
                         on_reset: Callable[[dict[TopicPartition, int]], None] | None = None,
                         **kw: Any) -> dict[Any, list[Any]]: ...

        async def _caught_up(self, consumer: AIOKafkaConsumer | None, tps: list[TopicPartition],
                             what: str) -> bool: ...

        def submit(self, event: dict[str, Any], mark: Mark | None = None) -> asyncio.Task[Any] | None: ...

        async def _announce(self, record: dict[str, Any], event: dict[str, Any], *, timed: bool = True) -> None: ...

        def dead_letter_later(self, source: str, bad: list[tuple[Any, ContractError]]) -> None: ...

    async def _consume_updates(self) -> None:
        assert self._updates is not None
        while True:
            batches = await self._fetch(self._updates, self._update_guard, self._updates_reset, timeout_ms=500)
            bad: list[tuple[Any, ContractError]] = []
            for records in batches.values():  # no await in here: a batch is noted at once
                for rec in records:
                    if rec.value is None:  # deleting a model is not supported: what it announced stays known
                        self.metrics.bad_messages.labels(topic="model-updates", reason="tombstone").inc()
                        log.info("model-updates tombstone of %r at %s:%d: ignored (deleting a model is not "
                                 "supported)", rec.key, rec.topic, rec.offset)
                        continue
                    try:
                        update = decode("model-updates", rec.value)
                        check_key("model-updates", rec.key, update)
                    except ContractError as exc:
                        self.metrics.bad_messages.labels(topic="model-updates", reason=exc.reason).inc()
                        log.warning("bad model-update at %s:%d: %s", rec.topic, rec.offset, exc)
                        bad.append((rec, exc))
                        continue
                    self._note_announced(update)
            if bad:
                self.dead_letter_later("model-updates", bad)

    def _note_announced(self, update: dict[str, Any]) -> None:
        key, version = update["model_key"], int(update["version"])
        if version >= self.announced.get(key, (0, ""))[0]:
            self.announced[key] = (version, update["sha256"])
            self.metrics.model_version.labels(model_key=key).set(version)  # whoever announced it (a rollback too)
        self._floor[key] = max(self._floor.get(key, 0), version)

    def _updates_reset(self, tps: Iterable[TopicPartition]) -> None:
        """Partitions of model-updates read again from their start (recreated, or trimmed): what they announced
        is known again once read; versions stay above everything seen (``_floor``)."""
        partitions = {tp.partition for tp in tps}
        n = contract("model-updates").partitions
        for key in [k for k in self.announced if partition_for(k.encode(), n) in partitions]:
            del self.announced[key]

    def _newest_announced(self, key: str) -> int:
        """The newest version this trainer has seen announced for ``key`` (a save goes above it)."""
        return self._floor.get(key, 0)

    async def _watch_registry(self) -> None:
        while True:
            await asyncio.sleep(self.registry_check_s)
            try:
                await self.check_registry()
            except RegistryUnavailableError:  # said and counted by the check; the next one tries again
                pass
            except Exception as exc:  # never the end of the trainer: the next check tries again
                log.warning("registry check failed: %r; trying again in %.0f s", exc, self.registry_check_s)

    async def check_registry(self) -> list[str]:
        """Compare each key's current version in the registry with the newest announced on model-updates, and
        start what brings them together (see the module docstring); the keys acted on. A key that cannot be
        checked (its record unreadable) is logged and skipped; the registry unavailable ends the check
        (:class:`~app.model.errors.RegistryUnavailableError`), the trainer degraded (``model_store``) until a check
        reaches it again."""
        await self._caught_up(self._updates, self._update_tps, "model-updates")
        try:
            acted = await self._check_keys()
        except RegistryUnavailableError as exc:
            self._check_unavailable(exc)
            raise
        if self._check_away is not None:
            self._check_away = None
            log.info("registry check: the model registry answers again")
            self._model_store_gauge()
        return acted

    def _check_unavailable(self, exc: RegistryUnavailableError) -> None:
        """The check could not reach the registry: degraded (``model_store``); one WARNING until a check reaches it."""
        said, self._check_away = self._check_away, str(exc)
        self._model_store_gauge()
        if said is None:
            log.warning("registry check: %s; degraded (model_store) until a check reaches it", exc)
        else:
            log.debug("registry check skipped: %s", exc)

    def _model_store_gauge(self) -> None:
        """``rtt_trainer_degraded{reason="model_store"}``: 1 while the registry check cannot reach the registry or a
        retrain waits for it (:meth:`TrainerService._registry_away`), else 0."""
        away = self._check_away is not None or bool(self._waiting)
        self.metrics.degraded.labels(MODEL_STORE).set(1 if away else 0)

    async def _check_keys(self) -> list[str]:
        """:meth:`check_registry` past catching up with model-updates."""
        store = self.registry.store
        acted: list[str] = []
        unreadable: dict[str, str] = {}
        for key in sorted(set(self.announced) | set(await asyncio.to_thread(store.keys))):
            if key in self._training:
                if key in self._unreadable:
                    unreadable[key] = self._unreadable[key]  # not checked now: as found last
                continue
            try:
                if await self._check_key(key):
                    acted.append(key)
            except RegistryUnavailableError:
                raise
            except Exception as exc:  # this key's records only: the other keys are checked
                unreadable[key] = why = str(exc) if isinstance(exc, RegistryError) else f"{type(exc).__name__}: {exc}"
                if self._unreadable.get(key) != why:
                    log.warning("registry check: model %s cannot be checked, skipped until it can: %s", key, why)
            else:
                if key in self._unreadable:
                    log.info("registry check: model %s can be checked again", key)
        self._unreadable = unreadable
        self.metrics.degraded.labels(UNREADABLE).set(1 if unreadable else 0)
        return acted

    async def _check_key(self, key: str) -> bool:
        """Check ``key`` (:meth:`check_registry`); whether something was started for it."""
        store = self.registry.store
        current = await asyncio.to_thread(store.current, key)
        version, sha = self.announced.get(key, (0, ""))
        newest = self._newest_announced(key)
        if current is not None and await asyncio.to_thread(self.registry.blob_missing, current):
            self._unannounced.pop(key, None)
            above = max(newest, current.version)
            self._say_lost(key, f"the registry's current v{current.version} (sha256 {current.sha256[:12]}) has its "
                           "metadata but its blob is gone, no process can load it: the registry lost it; replacing it "
                           f"with a version above v{above}")
            return self._replace(key)
        if current is not None and current.version > version and current.version >= newest:
            # promoted, not announced (or not yet); or its announcement is gone with a recreated topic
            if self._unannounced.get(key) != current.version:
                self._unannounced[key] = current.version
                return False
            del self._unannounced[key]
            log.warning("model %s: the registry's current v%d was never announced (newest announced: v%d): "
                        "announcing it", key, current.version, version)
            await self._announce(update_message(current), {"ts": self.clock.now(), "onset_ts": None}, timed=False)
            return True
        self._unannounced.pop(key, None)
        if (current is not None and (current.version, current.sha256) == (version, sha)) or (
                current is None and not newest):  # in agreement, or nothing ever served
            self._lost.pop(key, None)
            return False
        found = f"v{current.version} (sha256 {current.sha256[:12]})" if current is not None else "nothing"
        self._say_lost(key, f"model-updates announced v{newest} (sha256 {sha[:12] or '-'}), the registry's current "
                       f"is {found}: the registry lost it; replacing it with a version above v{newest}")
        return self._replace(key)

    def _say_lost(self, key: str, finding: str) -> None:
        """The check found ``key``'s model lost: one WARNING, unless the last check found the same (DEBUG)."""
        said = self._lost.get(key)
        if said is not None and said[0] == finding:
            log.debug("model %s: %s (as the check before found)", key, finding)
            return
        self._lost[key] = [finding]
        log.warning("model %s: %s", key, finding)

    def _repeated(self, key: str, reason: str, outcome: str) -> bool:
        """Whether a retrain of ``key`` for ``reason`` that could not replace its lost model says what the retrain
        before it said of that same lost model (``outcome``): said once, not on every registry check."""
        said = self._lost.get(key)
        if reason != REGISTRY_LOST or said is None:
            return False
        if said[1:] == [outcome]:
            return True
        said[1:] = [outcome]
        return False

    def _replace(self, key: str) -> bool:
        """Start the retrain that replaces ``key``'s lost model (reason ``registry``); whether it started."""
        return self.submit({"model_key": key, "reason": REGISTRY_LOST, "ts": self.clock.now(),
                            "onset_ts": None}) is not None
