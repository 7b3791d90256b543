"""The trainer's side of the model registry: score the champion, register and promote a challenger.

Blocking (Redis or file I/O): the service calls it from its training thread. The champion is the
key's *current* version, loaded through :func:`app.registry.store.load_predictor` (sha256 verified)
and scored on the challenger's holdout with its own feature names — on the rows after its record's
``training_window`` (:func:`app.trainer.pipeline.unseen`), the challenger on the same rows. When there is
no current version the result is None (no champion); when it cannot be loaded or evaluated — a corrupt blob, a booster
the fast predictor does not support — the champion's RMSE is NaN, so the challenger replaces it.

A challenger is saved (next version number) and promoted only once it has won, so the versions of a
key are the models that served, in order. The record becomes the model-updates value
(:func:`update_message`; :func:`announcement` is the message every announcer sends). A verdict is given again
on the same holdout when the key's current version changed while the challenger trained (an operator rolled
back, :meth:`ModelRegistry.judge_again`): a challenger replaces the model that serves, not the one it was
first compared with. Its registration is compare-and-set (:meth:`ModelRegistry.promote_challenger`): saved and
made current in one step only if the current version is still the champion it was judged against, else judged
again against the new current and registered only if it still wins — a rollback that landed while the trainer
waited for model-updates is never replaced by a challenger that only beat the model rolled back from. A refused
save stores nothing. A challenger refused :data:`PROMOTE_TRIES` times (the current version changing under it each
time) gives up with a WARNING: its retrain fails, and the key's next event trains again.

A save Redis applied whose reply was lost (a connection reset or a failover at the wrong moment) is tried again, and
the retry finds the current version changed — to the challenger itself. Refused with
:class:`~app.model.errors.CurrentChangedError` while the current version's blob is the challenger's (same sha256),
it is the challenger's own promotion: promoted, at that version, and not judged against itself. When the save ended
in :class:`~app.model.errors.RegistryUnavailableError` instead (Redis away for the retries too), the challenger's
sha256 is kept, and :meth:`ModelRegistry.landed` tells the retrain that tries again whether it landed.

A current version whose blob or metadata is gone (evicted from Redis, deleted by hand, a file removed from the
models directory) is a champion that cannot be loaded, at the version the current pointer names: the challenger is
judged against it as unusable and replaces that version. The registry check finds such a current version
(:meth:`ModelRegistry.blob_missing`: a look for its blob — Redis ``EXISTS`` of the key its location names, a file's
``stat`` — and only when that finds nothing a load of the version to be sure).

A version saved again (:meth:`ModelRegistry.reissue` for a registry that lost its newest versions,
:meth:`ModelRegistry.restore` for an operator's rollback) is the same verified blob under a new version above
every version announced, so every process that applies model-updates takes it; it replaces the current version
it was decided against, or nothing (:class:`~app.model.errors.CurrentChangedError`).

A save the store cannot make now — Redis away or refusing writes (out of memory, a read-only replica), or a models
directory that is full, read-only or gone — raises :class:`~app.model.errors.RegistryUnavailableError`;
:meth:`ModelRegistry.ready` tells the service when to try again: Redis takes a write, and a models directory takes
a write the size of the blob that did not fit.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import Any

from app.config import Settings
from app.contracts import encode
from app.model.errors import CurrentChangedError, ModelError, ModelNotFoundError, RegistryUnavailableError
from app.model.train import booster_to_bytes
from app.registry.base import ModelRecord, ModelStore, sha256_hex
from app.registry.directory import DirectoryModelStore
from app.registry.redis_store import RedisModelStore
from app.registry.store import load_predictor, open_store
from app.trainer.champion import MARGIN, Verdict
from app.trainer.history import Dataset
from app.trainer.pipeline import Challenger, judge_challenger, score_champion

log = logging.getLogger(__name__)

FORMAT = "ubj"
UNJUDGED = ""  # the champion's sha256 when not even its record could be read (the verdict is given again)
NO_CHAMPION = (0, None)  # the champion judged against when there was none: (version 0, no sha256)
PROMOTE_TRIES = 5  # compare-and-set refusals a challenger takes before it gives up


def update_message(record: ModelRecord) -> dict[str, Any]:
    """The model-updates fields a record provides (the service adds ``ts`` and ``onset_ts``)."""
    return {"model_key": record.model_key, "version": record.version, "sha256": record.sha256,
            "features": list(record.features), "metrics": dict(record.metrics), "location": record.location,
            "format": record.format}


def announcement(fields: Mapping[str, Any], *, ts: float, onset_ts: float | None) -> tuple[bytes, bytes]:
    """The key and the contract-checked value of the model-updates message announcing ``fields``
    (:func:`update_message`'s), as the trainer sends it (``ts``: now; ``onset_ts``: the drift that led to it)."""
    return str(fields["model_key"]).encode(), encode("model-updates", {**fields, "ts": ts, "onset_ts": onset_ts})


@dataclasses.dataclass(frozen=True)
class Landed:
    """A challenger whose save the registry may have applied without saying so: its blob's ``sha256``, its training
    ``window``, the newest version announced when it was saved (``after``: it was saved above), the verdict it was
    registered on and its holdout ``metrics``; :meth:`ModelRegistry.landed` adds the model-updates ``fields`` of
    the version that holds it."""

    sha256: str
    window: tuple[float, float] | None
    after: int
    verdict: Verdict
    metrics: dict[str, float]
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)


class ModelRegistry:
    """Champion scoring and challenger registration over a :class:`~app.registry.base.ModelStore`.

    Parameters
    ----------
    settings
        Used to open the store when ``store`` is not given.
    store
        The store to use (tests pass one with their own namespace).
    fmt
        Blob format, ``"ubj"`` (compact) or ``"json"``.
    """

    def __init__(self, settings: Settings | None = None, *, store: ModelStore | None = None,
                 fmt: str = FORMAT) -> None:
        if store is None:
            if settings is None:
                raise ValueError("ModelRegistry needs settings or a store")
            store = open_store(settings)
        if fmt not in ("ubj", "json"):
            raise ValueError(f"fmt must be 'ubj' or 'json' (got {fmt!r})")
        self.store = store
        self.fmt = fmt
        self._unsaved: dict[str, int] = {}  # key -> bytes of the blob its store could not take
        # key -> (version, sha256) of the champion last scored: NO_CHAMPION when there was none; version None
        # when not even its record could be read
        self._judged: dict[str, tuple[int | None, str | None]] = {}
        # key -> the challenger whose save ended with the registry unavailable: it may have landed (:meth:`landed`)
        self._unsure: dict[str, Landed] = {}

    def ready(self, model_key: str) -> None:
        """Return once the store would take ``model_key``'s next save, else raise
        :class:`~app.model.errors.RegistryUnavailableError`: it answers, a models directory takes a write as
        large as the blob it refused last (so a retrain is not spent on a model with no room to land), and Redis
        takes a write (not out of memory, not a read-only replica)."""
        self.store.current(model_key)
        if isinstance(self.store, DirectoryModelStore):
            self.store.check_writable(model_key, self._unsaved.get(model_key, 1))
        elif isinstance(self.store, RedisModelStore):
            self.store.check_writable(model_key)

    def _save(self, model_key: str, blob: bytes, replacing: int | None, **fields: Any) -> dict[str, Any]:
        """Save ``blob`` as the next version and make it current — in one step, only if the current version is
        still ``replacing`` (0: none; None: whatever it is), else :class:`CurrentChangedError` and nothing saved;
        its model-updates fields. The size of a blob the store could not take is kept for :meth:`ready`."""
        try:
            saved = self.store.save(model_key, blob, replacing=replacing, **fields)
            if replacing is None:
                saved = self.store.promote(model_key, saved.version)
        except RegistryUnavailableError:
            self._unsaved[model_key] = len(blob)
            raise
        self._unsaved.pop(model_key, None)
        return update_message(saved)

    def champion_metrics(self, model_key: str, holdout: Dataset) -> dict[str, float] | None:
        """Holdout metrics of the current version; None without one; NaN RMSE when it is unusable."""
        try:
            predictor, record = load_predictor(self.store, model_key)
        except ModelNotFoundError as exc:
            if exc.version is None:  # no current version
                self._judged[model_key] = NO_CHAMPION
                return None
            # the current pointer names a version whose blob or metadata is gone: unusable, and replaced
            found = self._current(model_key)
            self._judged[model_key] = (exc.version, found[1] if found[0] == exc.version else UNJUDGED)
            log.warning("champion of %s: current version %d is not in the registry (%s): treating it as unusable",
                        model_key, exc.version, exc)
            return {"rmse_ms": math.nan}
        except RegistryUnavailableError:
            raise  # Redis away says nothing about the champion: the retrain is tried again later
        except (ModelError, ValueError) as exc:
            log.warning("champion of %s cannot be loaded (%s): treating it as unusable", model_key, exc)
            self._judged[model_key] = self._current(model_key)
            return {"rmse_ms": math.nan}
        self._judged[model_key] = (record.version, record.sha256)
        try:
            fit_end = record.training_window[1] if record.training_window else None
            metrics = score_champion(predictor, holdout, fit_end)
        except (ModelError, ValueError) as exc:
            log.warning("champion %s v%d cannot be scored (%s)", model_key, record.version, exc)
            return {"rmse_ms": math.nan}
        log.info("champion %s v%d: holdout rmse %.1f ms on %d rows", model_key, record.version, metrics["rmse_ms"],
                 metrics["n"])
        return metrics

    def _current(self, model_key: str) -> tuple[int | None, str | None]:
        """(version, sha256) of the current record; :data:`NO_CHAMPION` without a current version; version None
        and sha256 :data:`UNJUDGED` if it cannot be read."""
        try:
            return self._pointer(model_key)
        except (ModelError, ValueError):
            return None, UNJUDGED

    def _pointer(self, model_key: str) -> tuple[int, str | None]:
        """(version, sha256) of the version the key's current pointer names: sha256 None when its metadata is gone;
        :data:`NO_CHAMPION` when there is no current version."""
        current = self.store.current(model_key)
        if current is not None:
            return current.version, current.sha256
        try:  # no current version, or one whose metadata is gone: the error names which
            _, record = self.store.load(model_key)
        except ModelNotFoundError as exc:
            return (exc.version, None) if exc.version is not None else NO_CHAMPION
        return record.version, record.sha256  # made current since

    def blob_missing(self, record: ModelRecord) -> bool:
        """Whether the blob of ``record``, the current version of its key as just read, is gone while its metadata
        stays (deleted by hand, evicted, a partial restore): no process can load that version. A cheap look first
        (:meth:`~app.registry.base.ModelStore.blob_stored`: Redis ``EXISTS``, a file's ``stat``), and only when that
        finds nothing a load of the version to be sure; True only while the key's current version is still
        ``record``'s. The registry away raises
        :class:`~app.model.errors.RegistryUnavailableError`."""
        if self.store.blob_stored(record):
            return False
        key = record.model_key
        try:
            self.store.load(key, record.version)
        except ModelNotFoundError as exc:
            if exc.version != record.version:
                return False
            current = self.store.current(key)  # promoted meanwhile (and the version trimmed): nothing lost
            return current is not None and (current.version, current.sha256) == (record.version, record.sha256)
        return False

    def champion_version(self, model_key: str) -> int | None:
        """The version :meth:`champion_metrics` scored last (0: there was none), which a challenger judged against
        it replaces; None when not known (never scored, or its record unreadable: registered without the check)."""
        return self._judged.get(model_key, (None, None))[0]

    def judge_again(self, model_key: str, challenger: Challenger, verdict: Verdict,
                    margin: float = MARGIN, meanwhile: str = "trained") -> Verdict:
        """``verdict`` if the key's current model is still the champion :meth:`champion_metrics` scored last, else
        the verdict against the current one on the challenger's holdout (an operator rolled back while it
        ``meanwhile``: the challenger must beat the model that serves now). The same model saved again under a
        new version is the same champion (the verdict stands, the new version is the one it replaces)."""
        if model_key not in self._judged:
            return verdict
        version, sha256 = self._pointer(model_key)
        if sha256 == self._judged[model_key][1]:  # None and None: no current version, or its metadata gone
            self._judged[model_key] = (version, sha256)
            return verdict
        log.warning("retrain of %s: the current model changed to %s while the challenger %s: judging it again",
                    model_key, f"v{version}" if version else "none", meanwhile)
        return judge_challenger(challenger, self.champion_metrics(model_key, challenger.holdout), margin=margin)

    def register(self, model_key: str, challenger: Challenger, after: int = 0,
                 replacing: int | None = None) -> dict[str, Any]:
        """Save the challenger as the next version (above ``after``, the newest announced), make it current,
        return its model-updates fields. ``replacing``: only in place of that version (0: none), else
        :class:`CurrentChangedError` and nothing saved."""
        return self._register(model_key, challenger, booster_to_bytes(challenger.result.booster, self.fmt), after,
                              replacing)

    def _register(self, model_key: str, challenger: Challenger, blob: bytes, after: int,
                  replacing: int | None) -> dict[str, Any]:
        result = challenger.result
        holdout = challenger.holdout
        n = challenger.n_fit + len(holdout)
        metrics = {**challenger.metrics, **{k: v for k, v in result.metrics.items() if k.startswith("n_")}}
        metrics["n_holdout"] = float(len(holdout))
        return self._save(model_key, blob, replacing, fmt=self.fmt, features=list(result.feature_names),
                          params=result.params, metrics=metrics, n_samples=n, training_window=challenger.fit_window,
                          after=after)

    def _own(self, model_key: str, saving: Landed) -> dict[str, Any] | None:
        """The model-updates fields of ``model_key``'s current version if it is the challenger ``saving`` describes,
        saved though the save seemed to fail: its blob (sha256), trained on its rows (training window), not a copy
        saved again (a rollback to a model the same as the challenger), above the newest version announced when it
        was saved; else None."""
        current = self.store.current(model_key)
        if current is None or (current.sha256, current.training_window) != (saving.sha256, saving.window) or (
                current.restores is not None or current.version <= saving.after):
            return None
        return update_message(current)

    def unsure(self, model_key: str) -> bool:
        """Whether a challenger of ``model_key`` may have landed unannounced (:meth:`landed` tells)."""
        return model_key in self._unsure

    def landed(self, model_key: str) -> Landed | None:
        """The challenger of ``model_key`` whose save ended with the registry unavailable, if that save was applied
        after all (the current version holds its blob), with the model-updates fields of that version; else None.
        Asked by the retrain that tries again once the registry answers: it announces that version instead of
        judging a new challenger against its own model. Forgotten once answered, either way."""
        unsure = self._unsure.get(model_key)
        if unsure is None:
            return None
        own = self._own(model_key, unsure)  # the registry away still: raised, and asked again later
        del self._unsure[model_key]
        if own is None:
            return None
        log.warning("retrain of %s: the challenger's save was applied though the registry did not answer it: it is "
                    "current as v%d", model_key, own["version"])
        return dataclasses.replace(unsure, fields=own)

    def promote_challenger(self, model_key: str, challenger: Challenger, verdict: Verdict, after: int = 0,
                           margin: float = MARGIN) -> tuple[Verdict, dict[str, Any] | None]:
        """Register a challenger that won (``verdict``) in place of the champion it was judged against; while the
        current version changed before it landed (:class:`CurrentChangedError`: an operator rolled back, another
        trainer promoted), judged again against the new current on the same holdout and registered in its place
        only if it still wins. The final verdict and the model-updates fields (None: it lost, nothing saved)."""
        if not verdict.promote:
            return verdict, None
        blob = booster_to_bytes(challenger.result.booster, self.fmt)
        saving = Landed(sha256_hex(blob), challenger.fit_window, after, verdict, dict(challenger.metrics))
        self._unsure.pop(model_key, None)
        for tries in range(1, PROMOTE_TRIES + 1):
            try:
                return verdict, self._register(model_key, challenger, blob, after, self.champion_version(model_key))
            except RegistryUnavailableError:  # applied or not: the retrain that tries again asks (landed)
                self._unsure[model_key] = dataclasses.replace(saving, verdict=verdict)
                raise
            except CurrentChangedError as exc:
                own = self._own(model_key, saving)
                if own is not None:  # the save was applied, its reply lost, and the retry found it current
                    log.warning("retrain of %s: the challenger is current already, as v%d: its save was applied "
                                "though the registry did not answer it (%s): promoted", model_key, own["version"], exc)
                    return verdict, own
                if tries == PROMOTE_TRIES:
                    log.warning("retrain of %s: gave up registering the challenger after %d tries, the current "
                                "version changing each time (%s)", model_key, tries, exc)
                    raise
                verdict = self.judge_again(model_key, challenger, verdict, margin, "waited to be registered")
            if not verdict.promote:
                now = self.champion_version(model_key)
                log.warning("retrain of %s: the current version changed to %s while the challenger waited to be "
                            "registered, and the challenger does not beat it (%s): rejected", model_key,
                            f"v{now}" if now else "none", verdict.reason)
                return verdict, None
        raise AssertionError("unreachable: the last refusal is raised")

    def reissue(self, model_key: str, after: int) -> dict[str, Any] | None:
        """Save the current version again as a new one above ``after`` and make it current; its model-updates
        fields, or None when the key has no current version.

        For a registry that lost its newest versions (Redis restarted from an older snapshot): the models in
        use there, announced as ``after``, are gone, and an announcement of the older current version would
        be ignored by every process holding a newer one.
        """
        try:
            blob, record = self.store.load(model_key)
        except ModelNotFoundError:
            return None
        return self._save_again(blob, record, after, record.restores, replacing=record.version)

    def restore(self, model_key: str, version: int, after: int, replacing: int | None = None) -> dict[str, Any]:
        """Save kept ``version`` of ``model_key`` (its verified blob) again as a new version above ``after`` and
        above every version the registry gave, and make it current: an operator's rollback, as every process
        that applies model-updates will take it (they ignore a version older than the one they hold). The new
        record's ``restores`` names the version whose model it is. Its model-updates fields. ``replacing``: only in
        place of that current version, else :class:`CurrentChangedError` and nothing saved."""
        blob, record = self.store.load(model_key, version)
        return self._save_again(blob, record, after, record.restores or record.version, replacing)

    def _save_again(self, blob: bytes, record: ModelRecord, after: int, restores: int | None,
                    replacing: int | None) -> dict[str, Any]:
        return self._save(record.model_key, blob, replacing, fmt=record.format, features=list(record.features),
                          params=dict(record.params), metrics=dict(record.metrics), n_samples=record.n_samples,
                          training_window=record.training_window, after=after, restores=restores)
