"""The extender under faults: view messages from the future or with lying keys, model loads while Redis is away."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from extender_fixtures import LinearPredictor
from prometheus_client import CollectorRegistry

from app.clock import ManualClock
from app.config import Settings
from app.extender.feed import ViewFeed
from app.extender.metrics import ExtenderMetrics
from app.extender.model_retry import Degraded, retrying_loader
from app.extender.models import ModelLoadError
from app.scheduler.builder import SnapshotBuilder

NOW = 1_800_000_000.0


def features(node: str, ts: float) -> bytes:
    return orjson.dumps({"node": node, "ts": ts, "node_class": "gpu", "gpu_model": None, "window_s": 30.0,
                         "count": 3, "features": {"load__mean": 1.0}})


def test_a_view_value_from_the_future_or_under_another_key_is_refused() -> None:
    builder, metrics = SnapshotBuilder(), ExtenderMetrics()

    async def loader(u: Any) -> LinearPredictor:
        return LinearPredictor({"load__mean": 1.0})

    feed = ViewFeed(Settings.from_env({}), builder, loader, metrics, rebuild=lambda: None, clock=ManualClock(NOW))
    assert feed.apply("node-features", b"n1", features("n1", 9.9e10)) == "ts_in_future"
    assert feed.apply("node-features", b"n2", features("n1", NOW)) == "key_mismatch"
    assert builder.node_count == 0
    # the node is not pinned: its next valid value is applied, an hour-old one too (it is merely stale)
    assert feed.apply("node-features", b"n1", features("n1", NOW - 3600)) == "applied"
    assert feed.apply("node-features", b"n1", features("n1", NOW)) == "applied"
    assert metrics.registry.get_sample_value("rtt_extender_feed_messages_total",
                                             {"topic": "node-features", "result": "ts_in_future"}) == 1.0


class Flaky:
    """A loader that fails as 'registry unavailable' ``n`` times, then loads."""

    def __init__(self, n: int, transient: bool = True) -> None:
        self.n, self.transient, self.calls = n, transient, 0

    async def __call__(self, update: Any) -> LinearPredictor:
        self.calls += 1
        if self.calls <= self.n:
            raise ModelLoadError("redis away", transient=self.transient)
        return LinearPredictor({"load__mean": 1.0})


def loader_with(flaky: Flaky, superseded: Any = lambda u: False) -> tuple[Any, Degraded, list[Any]]:
    degraded = Degraded(CollectorRegistry())
    waits: list[Any] = []
    return retrying_loader(flaky, degraded, max_backoff_s=0.02, superseded=superseded,
                           on_wait=waits.append), degraded, waits


def test_a_load_is_retried_while_the_registry_is_unavailable_and_reports_degraded() -> None:
    flaky = Flaky(3)
    load, degraded, waits = loader_with(flaky)
    seen: list[dict[str, str]] = []

    async def run() -> Any:
        task = asyncio.ensure_future(load({"model_key": "gCTF:gpu", "version": 2}))
        while not task.done():
            seen.append(dict(degraded.reasons))
            await asyncio.sleep(0.001)
        return task.result()

    assert isinstance(asyncio.run(run()), LinearPredictor)
    assert flaky.calls == 4 and len(waits) == 1
    assert any("model_store" in s for s in seen) and degraded.reasons == {}
    assert degraded.gauge.labels("model_store")._value.get() == 0


def test_a_superseded_load_ends_and_a_broken_model_fails_at_once() -> None:
    load, degraded, _ = loader_with(Flaky(100), superseded=lambda u: True)
    with pytest.raises(ModelLoadError, match="superseded"):
        asyncio.run(load({"model_key": "gCTF:gpu", "version": 2}))
    broken = Flaky(1, transient=False)
    load, degraded, waits = loader_with(broken)
    with pytest.raises(ModelLoadError, match="redis away"):
        asyncio.run(load({"model_key": "gCTF:gpu", "version": 2}))
    assert broken.calls == 1 and waits == [] and degraded.reasons == {}
