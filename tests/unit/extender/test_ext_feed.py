"""The view feed's message handling and model installation (the Kafka loop itself is integration-tested)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from extender_fixtures import LinearPredictor

from app.config import Settings
from app.extender.feed import ViewFeed
from app.extender.metrics import ExtenderMetrics
from app.extender.models import ModelLoadError, install_model
from app.scheduler.builder import SnapshotBuilder

SHA = "0" * 64


def update(version: int, key: str = "gCTF:gpu") -> dict[str, Any]:
    return {"model_key": key, "version": version, "sha256": SHA, "features": ["load__mean"], "metrics": {},
            "location": "redis://x#k", "ts": 1.0}


def features(node: str, ts: float) -> bytes:
    return orjson.dumps({"node": node, "ts": ts, "node_class": "gpu", "gpu_model": None, "window_s": 30.0,
                         "count": 3, "features": {"load__mean": 1.0}})


def make_feed(loader: Any) -> tuple[ViewFeed, SnapshotBuilder, ExtenderMetrics]:
    builder, metrics = SnapshotBuilder(), ExtenderMetrics()
    return ViewFeed(Settings.from_env({}), builder, loader, metrics, rebuild=lambda force: None), builder, metrics


async def test_messages_applied_ignored_rejected_deleted() -> None:
    async def loader(u: Any) -> LinearPredictor:
        return LinearPredictor({"load__mean": 1.0})

    feed, builder, metrics = make_feed(loader)
    assert feed.apply("node-features", b"n1", features("n1", 10.0)) == "applied"
    assert feed.apply("node-features", b"n1", features("n1", 9.0)) == "ignored"
    assert feed.apply("node-features", b"n1", b'{"node": "n1"}') == "rejected"
    assert feed.apply("node-weights", b"n1", b"not json") == "rejected"
    assert feed.apply("node-features", b"n1", None) == "deleted" and builder.node_count == 0
    assert feed.apply("model-updates", b"gCTF:gpu", None) == "tombstone"
    assert feed.apply("model-updates", b"gCTF:gpu", orjson.dumps(update(2))) == "applied"
    await asyncio.sleep(0.05)
    assert builder.model_version("gCTF:gpu") == 2
    assert feed.apply("model-updates", b"gCTF:gpu", None) == "tombstone"  # deleting a model is not supported
    await asyncio.sleep(0.05)
    assert builder.model_version("gCTF:gpu") == 2
    assert feed.apply("model-updates", b"gCTF:gpu", orjson.dumps(update(1))) == "ignored"
    text = metrics.render().decode()
    assert 'rtt_extender_feed_messages_total{result="rejected",topic="node-features"} 1.0' in text
    assert 'rtt_extender_model_loads_total{result="loaded"} 1.0' in text
    await feed.stop()


async def test_failed_load_keeps_the_old_model_and_counts() -> None:
    async def broken(u: Any) -> LinearPredictor:
        raise ModelLoadError("sha256 mismatch")

    builder, metrics = SnapshotBuilder(), ExtenderMetrics()
    model = LinearPredictor({"load__mean": 1.0})
    builder.set_model("gCTF:gpu", 1, model)
    cached: list[Any] = []

    async def on_installed(u: Any) -> None:
        cached.append(u)

    assert not await install_model(update(2), broken, builder, metrics, on_installed)
    assert builder.model_version("gCTF:gpu") == 1 and cached == []
    assert 'rtt_extender_model_loads_total{result="failed"} 1.0' in metrics.render().decode()

    async def ok(u: Any) -> LinearPredictor:
        return model

    assert await install_model(update(3), ok, builder, metrics, on_installed)
    assert builder.model_version("gCTF:gpu") == 3 and [u["version"] for u in cached] == [3]


async def test_records_a_fetch_waited_for_are_applied_in_a_later_loop_step() -> None:
    """aiokafka builds a fetch's records in the loop step that ends the wait for them; applying them in that
    same step would make it that much longer than a slice: the feed yields to the loop first."""
    from aiokafka.structs import TopicPartition

    feed, _, _ = make_feed(None)
    events: list[str] = []
    topic = Settings.from_env({}).topic("node-features")

    class Records:  # what the consumer hands over: one fetch after a wait, then nothing more
        def __init__(self) -> None:
            self.fetches = 0

        async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
            self.fetches += 1
            if self.fetches > 1:
                await asyncio.Event().wait()
            await asyncio.sleep(0.01)  # the wait for the broker's answer
            events.append("fetched")
            msg = type("Msg", (), {"key": b"n1", "value": features("n1", 10.0), "timestamp": 0})
            return {TopicPartition(topic, 0): [msg]}

    class Guard:
        def note(self, batches: object) -> None:
            pass

        async def after_fetch(self) -> None:
            pass

    apply = feed.apply
    feed.apply = lambda *a: (events.append("applied"), apply(*a))[1]  # type: ignore[method-assign]
    feed._consumer, feed._guard = Records(), Guard()  # type: ignore[assignment]
    feed.caught_up.set()

    async def ticker() -> None:
        while True:
            events.append("tick")
            await asyncio.sleep(0)

    tasks = [asyncio.ensure_future(feed._consume()), asyncio.ensure_future(ticker())]
    for _ in range(200):
        await asyncio.sleep(0.001)
        if "applied" in events:
            break
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    fetched, applied = events.index("fetched"), events.index("applied")
    assert "tick" in events[fetched:applied]


async def test_the_model_code_is_prepared_from_the_start_before_any_model_is_announced(monkeypatch) -> None:
    """A service that will load models (Kafka or Redis on) imports the model code and compiles the slowdown
    pricing's steps in a worker thread from its start, so the first model announced does not wait for them;
    one with neither never does."""
    import threading

    from app.extender import service as service_module
    from app.extender.options import ExtenderOptions
    from app.extender.service import ExtenderService

    calls: list[str] = []
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def prepare() -> None:
        calls.append(threading.current_thread().name)
        loop.call_soon_threadsafe(done.set)

    monkeypatch.setattr(service_module, "prepare_model_code", prepare)
    settings = Settings.from_env({"RTT_KAFKA_BOOTSTRAP": "127.0.0.1:1"})  # nothing there: the feed keeps retrying
    opts = ExtenderOptions.from_settings(settings)
    offline = ExtenderService(settings, opts, kafka=False, redis=False, publish=False)
    await offline.start()
    await asyncio.sleep(0.05)
    await offline.stop()
    assert calls == []
    online = ExtenderService(settings, opts, kafka=True, redis=False, publish=False)
    await online.start()
    try:
        await asyncio.wait_for(done.wait(), 10.0)
    finally:
        await online.stop()
    assert len(calls) == 1 and calls[0] != threading.current_thread().name  # once, off the event loop's thread
    assert online.builder.model_version("gCTF:gpu") is None  # no model was announced


async def test_an_urgent_rebuild_does_not_wait_out_the_interval_and_logs_the_model_serving(caplog) -> None:
    import logging

    from extender_fixtures import make_service, start_served, until

    service = make_service(rebuild_interval_s=30.0)
    try:
        await start_served(service)
        assert "upload:cpu" not in service.holder.current.models
        service.builder.set_model("upload:cpu", 1, LinearPredictor({"load__mean": 1.0}))
        service.request_rebuild()  # an ordinary change waits for the interval (30 s here)
        await asyncio.sleep(0.2)
        assert "upload:cpu" not in service.holder.current.models
        with caplog.at_level(logging.INFO, logger="app.extender.service"):
            service.request_rebuild(urgent=True)  # what the feed's hook asks once a model changed the view
            await until(lambda: "upload:cpu" in service.holder.current.models)
        assert service.holder.current.models["upload:cpu"].version == 1
        assert "model upload:cpu v1 serving" in caplog.text
    finally:
        await service.stop()


async def test_a_model_the_feed_installs_is_built_into_the_served_snapshot_at_once() -> None:
    """The feed's model hook (``on_model``, awaited only when a model changed the view) asks for an
    immediate build: the new model serves without waiting out the rebuild interval."""
    from extender_fixtures import make_service, start_served, until

    async def loader(u: Any) -> LinearPredictor:
        return LinearPredictor({"load__mean": 1.0})

    service = make_service(rebuild_interval_s=30.0)
    try:
        await start_served(service)
        await asyncio.sleep(0.05)  # the rebuilder is now waiting out its 30 s
        feed = ViewFeed(Settings.from_env({}), service.builder, loader, service.metrics,
                        rebuild=service.request_rebuild, on_model=service._model_installed)
        assert await feed.load_model(update(1, "upload:cpu"))
        await until(lambda: "upload:cpu" in service.holder.current.models)
        assert service.holder.current.models["upload:cpu"].version == 1
    finally:
        await service.stop()
