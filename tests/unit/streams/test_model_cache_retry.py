"""The worker's models while the registry is unreachable: kept, retried with backoff, superseded, reported."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from test_feedback_models import save

from app.config import Settings
from app.model.errors import RegistryUnavailableError
from app.registry.directory import DirectoryModelStore
from app.streams.feedback_models import ModelCache


class Unreachable:
    """A store whose loads fail as 'unavailable' until ``up`` is set."""

    def __init__(self, store: DirectoryModelStore) -> None:
        self.store, self.up, self.tries = store, False, 0

    def load(self, key: str, version: int | None = None) -> Any:
        self.tries += 1
        if not self.up:
            raise RegistryUnavailableError("model registry at redis://r:6379/0 unavailable: connection refused")
        return self.store.load(key, version)


def test_an_update_is_kept_while_the_registry_is_away_and_loaded_when_it_is_back(tmp_path: Path) -> None:
    real = DirectoryModelStore(tmp_path)
    store = Unreachable(real)
    cache = ModelCache(Settings.from_env({"RTT_RETRY_MAX_BACKOFF_S": "0.05"}), store=store)  # type: ignore[arg-type]
    u1, u2, u3 = (save(real, "gCTF:gpu", float(k)) for k in (1, 2, 3))

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {"applied": await cache.apply(u1)}
        out["pending"] = sorted((k, u["version"]) for k, u in cache.pending.items())
        out["degraded"] = dict(cache.health.status()["degraded"])
        await cache.apply(u2)  # a newer version supersedes the waiting one
        out["superseded"] = cache.pending["gCTF:gpu"]["version"]
        await asyncio.sleep(0.3)
        out["tries"] = store.tries
        store.up = True
        for _ in range(400):  # the first load compiles the fast predictor
            if cache.version("gCTF:gpu") is not None and not cache.pending:
                break
            await asyncio.sleep(0.05)
        out["version"], out["left"] = cache.version("gCTF:gpu"), dict(cache.pending)
        out["after"] = dict(cache.health.status()["degraded"])
        out["late"] = await cache.apply(u1)  # the older announcement, seen again: nothing to do
        await cache.apply(u3)
        await cache.close()
        return out

    r = asyncio.run(run())
    assert r["applied"] is False and r["pending"] == [("gCTF:gpu", 1)]
    assert "model_store" in r["degraded"] and "connection refused" in r["degraded"]["model_store"]
    assert r["superseded"] == 2 and r["tries"] >= 3  # retried while away
    assert r["version"] == 2 and r["left"] == {} and "model_store" not in r["after"]
    assert r["late"] is False and cache.version("gCTF:gpu") == 3
    retries = cache.metrics.value("rtt_worker_model_load_retries_total")
    assert r["tries"] - 1 <= retries <= r["tries"]  # each failed load counted (one may race the registry's return)
    assert cache.metrics.value("rtt_worker_degraded", reason="model_store") == 0
    assert cache.metrics.value("rtt_worker_model_version", model_key="gCTF:gpu") == 3
