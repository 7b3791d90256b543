"""Turn a model-updates message into a ready :class:`~app.model.base.Predictor`, off the event loop.

The blob comes from the model registry (Redis, or a local directory), is checked against the message's
sha256, and is parsed by the fast predictor — all in a worker thread, so request handling never waits.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from app.config import Settings
from app.errors import RttError
from app.extender.metrics import ExtenderMetrics
from app.model.base import Predictor
from app.scheduler.builder import SnapshotBuilder

log = logging.getLogger(__name__)

ModelLoader = Callable[[Mapping[str, Any]], Awaitable[Predictor]]


class ModelLoadError(RttError):
    """An announced model could not be fetched, verified or parsed; ``transient`` when the registry was
    unreachable (try again later) rather than the model wrong."""

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


_prepare_lock = threading.Lock()
_prepared: list[bool] = []


def prepare_model_code() -> None:
    """Import the registry and model code (XGBoost, numba: ~0.2 s) and compile the slowdown pricing's steps
    (:func:`~app.scheduler.inflict.warm_kernels`: ~0.2 s from numba's cache), once per process and blocking:
    for a worker thread. The extender runs it in one from its start, so that the first model announced does
    not wait for it (0.4-0.5 s on a busy two-core machine, most of a first model's way from retrain-event to
    serving)."""
    with _prepare_lock:
        if _prepared:
            return
        import app.registry.store  # noqa: F401  (XGBoost and numba with it)
        from app.scheduler.inflict import warm_kernels

        warm_kernels()
        _prepared.append(True)


def registry_loader(settings: Settings) -> ModelLoader:
    """A loader reading blobs from the registry :func:`app.registry.store.open_store` opens for ``settings``.

    The registry verifies the blob's sha256 against its record; the loader also checks that record against
    the announcement, so a message and a blob that disagree never become a model. The registry and the model
    code (XGBoost, numba) are imported in the worker thread of the first load, never on the event loop.
    """
    opened: list[Any] = []
    lock = threading.Lock()

    def load_sync(update: Mapping[str, Any]) -> Predictor:
        # Late on purpose: the registry brings XGBoost and numba (~1 s); they load here, in the loader's
        # worker thread, so neither the extender's start nor its event loop waits for them.
        from app.model.errors import RegistryUnavailableError
        from app.registry.store import load_predictor, open_store

        prepare_model_code()  # at once when the extender's start already did
        with lock:
            if not opened:
                opened.append(open_store(settings))
        key, version, sha = update["model_key"], int(update["version"]), update["sha256"]
        try:
            predictor, record = load_predictor(opened[0], key, version)
        except RttError as exc:
            raise ModelLoadError(f"{key} v{version}: {exc}", isinstance(exc, RegistryUnavailableError)) from exc
        if record.sha256 != sha:
            raise ModelLoadError(f"{key} v{version}: registry sha256 {record.sha256} is not the announced {sha}")
        announced = tuple(update.get("features") or ())
        if announced and tuple(predictor.feature_names) != announced:
            raise ModelLoadError(f"{key} v{version}: the blob's features differ from the announced ones")
        return predictor

    async def load(update: Mapping[str, Any]) -> Predictor:
        return await asyncio.to_thread(load_sync, update)

    return load


async def install_model(
    update: Mapping[str, Any], loader: ModelLoader, builder: SnapshotBuilder, metrics: ExtenderMetrics,
    on_installed: Callable[[Mapping[str, Any]], Awaitable[Any]] | None = None,
) -> bool:
    """Fetch, verify and install one announced model; False (logged, counted) when that fails."""
    key, version = update["model_key"], int(update["version"])
    try:
        predictor = await loader(update)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        metrics.model_loads.labels("failed").inc()
        log.error("model %s v%d not loaded: %s", key, version, exc)
        return False
    metrics.model_loads.labels("loaded").inc()
    if builder.set_model(key, version, predictor):
        log.info("model %s v%d installed (%d features)", key, version, len(predictor.feature_names))
        if on_installed is not None:
            try:
                await on_installed(update)
            except Exception as exc:
                log.warning("model %s v%d: post-install hook failed: %s", key, version, exc)
    return True
