"""Which model store a process uses (:func:`open_store`), and a verified predictor from it (:func:`load_predictor`).

Two stores implement :class:`~app.registry.base.ModelStore`:
:class:`~app.registry.redis_store.RedisModelStore` (production; every process sees the same models) and
:class:`~app.registry.directory.DirectoryModelStore` (a local directory, when no Redis is configured).
:func:`open_store` picks one from the settings. The life of a model version::

    record = store.save(key, booster_to_bytes(result.booster), fmt="ubj", ...)   # a challenger
    if challenger_wins:
        store.promote(key, record.version, replacing=champion.version)            # now the champion
    ...
    store.rollback(key)                                                           # back to the previous one

``save`` never changes what ``load(key)`` returns: only ``promote`` and ``rollback`` move the current
pointer — or ``save(..., replacing=v)``, which saves and promotes in one step. ``replacing`` makes a promotion
compare-and-set: it happens only if ``v`` is still current (:class:`~app.model.errors.CurrentChangedError`
otherwise, nothing changed). Each store keeps the newest ``keep`` versions and the current one; older blobs are
deleted.

>>> import tempfile
>>> from app.registry.directory import DirectoryModelStore
>>> tmp = tempfile.TemporaryDirectory()
>>> store = DirectoryModelStore(tmp.name, keep=2)
>>> r = store.save("gCTF:gpu", b"blob-1", fmt="json", features=["a"], params={}, metrics={}, n_samples=1)
>>> r.version, store.current("gCTF:gpu")
(1, None)
>>> store.promote("gCTF:gpu", 1, replacing=0).version, store.load("gCTF:gpu")[0]
(1, b'blob-1')
>>> store.save("gCTF:gpu", b"blob-2", fmt="json", features=["a"], params={}, metrics={}, n_samples=1, replacing=0)
Traceback (most recent call last):
...
app.model.errors.CurrentChangedError: model 'gCTF:gpu': the current version is v1, not none: nothing changed
>>> [r.version for r in store.versions("gCTF:gpu")]
[1]
>>> tmp.cleanup()
"""

from __future__ import annotations

from app.config import Settings
from app.model.fast import FastPredictor
from app.registry.base import ModelRecord, ModelStore
from app.registry.directory import DirectoryModelStore
from app.registry.redis_store import RedisModelStore


def registry_namespace(topic_prefix: str) -> str:
    """The Redis namespace of the models of a deployment: one per topic prefix, as the scheduler cache's.

    >>> registry_namespace(""), registry_namespace("staging-")
    ('rttsched', 'rttsched:staging-')
    """
    return f"rttsched:{topic_prefix}" if topic_prefix else "rttsched"


def open_store(settings: Settings, keep: int | None = None, timeout_s: float | None = None) -> ModelStore:
    """:class:`~app.registry.redis_store.RedisModelStore` at ``settings.redis_url`` (namespace
    :func:`registry_namespace`) when set, else a :class:`~app.registry.directory.DirectoryModelStore` at
    ``settings.models_path``; ``keep`` defaults to ``settings.model_keep``, the Redis client's ``timeout_s`` to
    ``settings.redis_timeout_s``."""
    keep = settings.model_keep if keep is None else keep
    if settings.redis_url:
        return RedisModelStore(settings.redis_client_url, keep=keep,
                               namespace=registry_namespace(settings.topic_prefix),
                               timeout_s=settings.redis_timeout_s if timeout_s is None else timeout_s)
    return DirectoryModelStore(settings.models_path, keep=keep)


def load_predictor(store: ModelStore, model_key: str, version: int | None = None) -> tuple[FastPredictor, ModelRecord]:
    """The verified blob of ``model_key`` (current version by default) as a warmed-up :class:`FastPredictor`.

    The predictor's feature names are the record's, so rows built for the record match the model.
    """
    blob, record = store.load(model_key, version)
    return FastPredictor.from_bytes(blob, record.features or None), record
