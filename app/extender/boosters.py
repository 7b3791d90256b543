"""XGBoost boosters for ``/explain``, loaded on demand from the model registry and kept in a small LRU.

The extender scores with :class:`~app.model.fast.FastPredictor` forests and keeps no booster: a booster of the
GPU preset takes a few MB, and ``prioritize`` never needs one. ``/explain`` does (XGBoost's ``pred_contribs``),
so the first explanation that meets a model version loads its blob from the registry (the sha256 is checked
by the store), parses it and keeps it; the :data:`KEEP` most recently used stay. A load that fails is not
retried for :data:`RETRY_AFTER_S` (the registry away must not slow every explanation down), and a Redis store
gets short socket timeouts. Loading runs in the explanation's thread (the extender finishes explanations off
its event loop, never on the scheduling path); ``bench/bench_explain.py`` measures both the cold and the warm
answer.

>>> cache = BoosterCache(lambda key, version: (key, version))
>>> cache.get("gCTF:gpu", 3), cache.get("gCTF:gpu", 3) is cache.get("gCTF:gpu", 3), cache.loads
(('gCTF:gpu', 3), True, 1)
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from app.config import Settings
from app.errors import RttError

KEEP = 8
RETRY_AFTER_S = 10.0
REDIS_TIMEOUT_S = 1.0

Load = Callable[[str, int], Any]


class BoosterUnavailable(RttError):
    """The booster of a model version could not be loaded (recently); the message says why."""


class BoosterCache:
    """``get(key, version)`` -> booster: loaded by ``load`` once, the ``keep`` most recently used kept."""

    def __init__(self, load: Load, keep: int = KEEP, retry_after_s: float = RETRY_AFTER_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (got {keep})")
        self._load = load
        self._keep = keep
        self._retry_after_s = retry_after_s
        self._clock = clock
        self._boosters: OrderedDict[tuple[str, int], Any] = OrderedDict()
        self._failed: dict[tuple[str, int], tuple[float, str]] = {}
        self._lock = threading.Lock()
        self.loads = 0

    def get(self, key: str, version: int) -> Any:
        k = (key, int(version))
        with self._lock:
            if k in self._boosters:
                self._boosters.move_to_end(k)
                return self._boosters[k]
            failed = self._failed.get(k)
            if failed is not None and self._clock() - failed[0] < self._retry_after_s:
                raise BoosterUnavailable(failed[1])
            try:
                booster = self._load(key, int(version))
            except Exception as exc:
                self._failed[k] = (self._clock(), str(exc) or type(exc).__name__)
                raise BoosterUnavailable(self._failed[k][1]) from exc
            self._failed.pop(k, None)
            self.loads += 1
            self._boosters[k] = booster
            while len(self._boosters) > self._keep:
                self._boosters.popitem(last=False)
            return booster


def registry_boosters(settings: Settings) -> BoosterCache:
    """A cache loading from the registry :func:`app.registry.store.open_store` opens for ``settings``."""
    opened: list[Any] = []

    def load(key: str, version: int) -> Any:
        # Late on purpose, as in :func:`app.extender.models.registry_loader`: XGBoost loads with the first
        # explanation, in the thread that asked for it, never at the extender's start.
        from app.model.train import booster_from_bytes
        from app.registry.store import open_store

        if not opened:
            # Redis: never hang an explanation on a registry that does not answer
            opened.append(open_store(settings, timeout_s=min(REDIS_TIMEOUT_S, settings.redis_timeout_s)))
        blob, _record = opened[0].load(key, version)
        booster = booster_from_bytes(blob)
        booster.set_param({"nthread": 1})  # one pod's candidates: OpenMP's start-up costs more than it saves
        return booster

    return BoosterCache(load)
