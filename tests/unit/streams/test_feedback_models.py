"""Model hot-swap (sha256 verified) and node-weights on current features, with a real directory registry."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson
import pytest
import xgboost
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, OffsetOutOfRangeError

from app.clock import ManualClock
from app.config import Settings
from app.contracts import decode, encode
from app.drift.joinbuffer import JoinBuffer
from app.features.hardware import hardware_features
from app.features.vector import matrix
from app.kafka.embedded import free_port
from app.model.errors import RegistryUnavailableError
from app.model.train import booster_to_bytes
from app.registry.directory import DirectoryModelStore
from app.streams import feedback_models as fm
from app.streams.feedback_models import ModelCache
from app.streams.feedback_options import FeedbackOptions
from app.streams.feedback_outbox import ErrorsOutbox, outbox_row_key
from app.streams.feedback_state import FeedbackLoop
from app.streams.feedback_table import join_row_key
from app.streams.feedback_weights import weights_values
from app.streams.node_table import NodeStore
from app.streams.options import WorkerOptions

FEATURES = ["nvidia_smi_utilization_gpu__mean", "hw_gpu_fp32_tflops"]


def booster(scale: float) -> bytes:
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.uniform(0, 100, 300), rng.choice([3.52, 6.84], 300)]).astype(np.float32)
    y = scale * (100.0 + 5.0 * X[:, 0])
    b = xgboost.train({"max_depth": 3, "eta": 0.5}, xgboost.DMatrix(X, label=y, feature_names=FEATURES), 40)
    return booster_to_bytes(b, "ubj")


def save(store: DirectoryModelStore, key: str, scale: float) -> dict:
    r = store.save(key, booster(scale), fmt="ubj", features=FEATURES, params={}, metrics={}, n_samples=300)
    store.promote(key, r.version)
    return {"model_key": key, "version": r.version, "sha256": r.sha256}


def test_apply_swaps_newer_verified_versions_only(tmp_path: Path) -> None:
    store = DirectoryModelStore(tmp_path)
    cache = ModelCache(Settings(), store=store)
    swaps: list[tuple[str, int]] = []
    cache.on_swap.append(lambda k, v: swaps.append((k, v)))
    u1, u2 = save(store, "gCTF:gpu", 1.0), save(store, "gCTF:gpu", 2.0)

    async def run() -> list[bool]:
        return [await cache.apply(u2), await cache.apply(u1),  # an older update never replaces a newer model
                await cache.apply({**u2, "version": 99}),        # a version the registry does not have
                await cache.apply({**save(store, "gCTF:gpu", 3.0), "sha256": "0" * 64})]  # announced sha differs

    assert asyncio.run(run()) == [True, False, False, False]
    assert cache.version("gCTF:gpu") == 2 and swaps == [("gCTF:gpu", 2)]
    assert cache.keys_for_class("gpu") == {"gCTF": "gCTF:gpu"} and cache.keys_for_class("cpu") == {}


def make_loop(store: DirectoryModelStore, clock: ManualClock) -> FeedbackLoop:
    settings = Settings(scrape_interval_s=1.0, stale_after_scrapes=3.0, credibility_prior=0.4)
    nodes = NodeStore(10.0, WorkerOptions(), 1.0)
    loop = FeedbackLoop(settings, FeedbackOptions(), clock, SimpleNamespace(store=nodes),  # type: ignore[arg-type]
                        ModelCache(settings, store=store), JoinBuffer(60.0, clock=clock), None)  # type: ignore[arg-type]
    for name, gpu, util, last in [("m40", "Tesla M40", 20.0, 1000.0), ("k20", "Tesla K20c", 80.0, 990.0)]:
        state = nodes.state(name, 0, lambda _k: None)
        for t in range(int(last) - 9, int(last) + 1):
            state.update({"node": name, "ts": float(t), "node_class": "gpu", "gpu_model": gpu,
                          "metrics": {"nvidia_smi_utilization_gpu": util}}, partition=0)
    return loop


def test_node_weights_predict_on_current_features_with_the_swapped_model(tmp_path: Path) -> None:
    store = DirectoryModelStore(tmp_path)
    clock = ManualClock(1001.0)
    loop = make_loop(store, clock)
    before = {v["node"]: v for v in weights_values(loop, clock.now())}
    assert before["m40"]["predicted_rtt_ms"] == {} and before["m40"]["weight"] == 0.4  # no model, unseen node
    assert before["m40"]["stale"] is False and before["k20"]["stale"] is True  # 11 s > 3 scrapes of 1 s

    asyncio.run(loop.models.apply(save(store, "gCTF:gpu", 1.0)))
    for _ in range(3):
        loop.tracker("m40").add("gCTF", 110.0, 100.0)
        loop.tracker("m40").close(clock.now())
    after = {v["node"]: v for v in weights_values(loop, clock.now())}
    predictor = loop.models.predictor("gCTF:gpu")
    assert predictor is not None
    for name, gpu, util in [("m40", "Tesla M40", 20.0), ("k20", "Tesla K20c", 80.0)]:
        row = {"nvidia_smi_utilization_gpu__mean": util, **hardware_features("gpu", gpu)}
        expected = float(predictor.predict(matrix([row], predictor.feature_names))[0])
        assert after[name]["predicted_rtt_ms"]["gCTF"] == pytest.approx(expected)
        decode("node-weights", encode("node-weights", after[name]))
    assert after["k20"]["predicted_rtt_ms"]["gCTF"] > 2 * after["m40"]["predicted_rtt_ms"]["gCTF"]
    assert 0.4 < after["m40"]["weight"] < 1.0 and after["k20"]["weight"] == 0.4  # m40 was 10 % off, k20 unseen

    asyncio.run(loop.models.apply(save(store, "gCTF:gpu", 2.0)))  # hot swap: predictions double
    swapped = {v["node"]: v for v in weights_values(loop, clock.now())}
    ratio = swapped["m40"]["predicted_rtt_ms"]["gCTF"] / after["m40"]["predicted_rtt_ms"]["gCTF"]
    assert math.isclose(ratio, 2.0, rel_tol=0.05)


def test_a_partition_kept_across_a_rebalance_keeps_its_state_in_memory(tmp_path: Path) -> None:
    """Faust's recovery replays the changelog into the table up to an end taken before the last checkpoint was
    stored: rows deleted since come back. A partition the worker kept must not take them (an outbox row of a
    delivered message would be sent again); a partition new to the worker restores its rows."""
    clock = ManualClock(1001.0)
    loop = make_loop(DirectoryModelStore(tmp_path), clock)
    loop.outbox = ErrorsOutbox(loop.settings)
    waiting = orjson.dumps({"since": 1000.0, "c": None, "p": {"predicted_rtt_ms": 100.0}, "done": False})
    loop.restore({join_row_key(0, "m40", "t1"): waiting}, {0})
    assert ("t1", "m40") in loop.buffer
    clock.advance(61.0)
    loop.expire()  # t1 left; its tombstone is stored, but the replay brings its row back
    replayed = {join_row_key(0, "m40", "t1"): waiting, join_row_key(1, "k20", "t2"): waiting,
                outbox_row_key(0, "m40", 1050.0): orjson.dumps({"value": {"node": "m40", "ts": 1050.0}, "floor": 3})}
    loop.restore(replayed, {0, 1})
    assert ("t1", "m40") not in loop.buffer and len(loop.outbox) == 0  # kept partition 0: memory wins
    assert ("t2", "k20") in loop.buffer  # partition 1 is new here: restored
    assert loop.held == {0, 1}


def test_restored_outbox_entries_are_looked_for_again_until_the_broker_answers(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A restarted worker whose broker is away when it looks for its restored prediction-errors messages keeps
    trying (an entry never looked for is never sent) and reports itself degraded meanwhile; it stops once the
    partition is no longer its own, and is no longer degraded."""
    clock = ManualClock(1001.0)
    loop = make_loop(DirectoryModelStore(tmp_path), clock)
    loop.settings = dataclasses.replace(loop.settings, kafka_bootstrap=f"127.0.0.1:{free_port()}",  # nothing there
                                        retry_max_backoff_s=0.2)
    loop.outbox = ErrorsOutbox(loop.settings)
    row = {outbox_row_key(0, "m40", 1050.0): orjson.dumps({"value": {"node": "m40", "ts": 1050.0}, "floor": 3})}

    async def run() -> tuple[dict, int, dict]:
        loop.restore(row, {0})  # starts looking for the entry in the background
        (task,) = loop._background
        deadline = time.monotonic() + 30.0
        while len([r for r in caplog.records if "not reconciled yet" in r.getMessage()]) < 3:
            assert not task.done() and time.monotonic() < deadline
            await asyncio.sleep(0.05)
        degraded = dict(loop.health.status()["degraded"])
        assert loop.outbox is not None
        unchecked = loop.outbox.unchecked()
        loop.held.discard(0)  # revoked: its new owner looks for it
        loop.outbox.drop({0})
        await asyncio.wait_for(task, 10.0)
        return degraded, unchecked, loop.health.status()["degraded"]

    with caplog.at_level(logging.WARNING, logger="app.streams.feedback_state"):
        degraded, unchecked, after = asyncio.run(run())
    assert "errors_outbox" in degraded and "partitions [0]" in degraded["errors_outbox"]
    assert unchecked == 1 and after == {}


def test_a_checkpoint_whose_write_fails_leaves_its_changes_to_the_next(tmp_path: Path) -> None:
    """A write that raised (broker away) stored nothing: the next checkpoint writes the same rows again, or a
    restart would restore a tracker from before the periods it has since closed."""
    class Table:
        def __init__(self) -> None:
            self.fail, self.rows = True, []

        async def write(self, rows: list, **_kw: object) -> int:
            if self.fail:
                self.fail = False
                raise ConnectionError("broker away")
            self.rows.extend(rows)
            return len(rows)

    clock = ManualClock(1001.0)
    loop = make_loop(DirectoryModelStore(tmp_path), clock)
    loop.table = Table()  # type: ignore[assignment]
    loop.partitions["m40"] = 0
    loop.tracker("m40").add("gCTF", 110.0, 100.0)
    loop.dirty_nodes.add("m40")
    loop.buffer.add_prediction(("t1", "m40"), {"predicted_rtt_ms": 100.0})
    with pytest.raises(ConnectionError):
        asyncio.run(loop.checkpoint())
    assert asyncio.run(loop.checkpoint()) == 2
    assert sorted(k for k, _ in loop.table.rows) == [b"0|j|m40|t1", b"0|n|m40"]  # type: ignore[attr-defined]


def test_a_rewrite_writes_every_kept_row_of_its_partitions_again(tmp_path: Path) -> None:
    """The feedback changelog was recreated empty under a running worker: the next checkpoint writes every
    tracker, join entry and undelivered outbox entry of the rewound partitions, and nothing of the others."""
    class Table:
        def __init__(self) -> None:
            self.rows: list = []

        async def write(self, rows: list, **_kw: object) -> int:
            self.rows = list(rows)
            return len(rows)

    clock = ManualClock(1001.0)
    loop = make_loop(DirectoryModelStore(tmp_path), clock)
    loop.table = Table()  # type: ignore[assignment]
    loop.outbox = ErrorsOutbox(loop.settings)
    loop.partitions.update({"m40": 0, "k20": 1})
    for node in ("m40", "k20"):
        loop.tracker(node).add("gCTF", 110.0, 100.0)
        loop.dirty_nodes.add(node)
        loop.buffer.add_prediction(("t1", node), {"predicted_rtt_ms": 100.0})
    loop.outbox.stage(0, {"node": "m40", "ts": 1000.0, "apps": {}})
    asyncio.run(loop.checkpoint())  # all stored, in the topic that is then lost
    assert asyncio.run(loop.checkpoint()) == 0
    loop.rewrite({0})
    asyncio.run(loop.checkpoint())
    assert sorted(k for k, _ in loop.table.rows) == [b"0|e|m40|1000.0", b"0|j|m40|t1", b"0|n|m40"]  # type: ignore[attr-defined]


def test_node_weights_read_the_node_counts_as_the_extender_does(tmp_path: Path) -> None:
    """A model reading ``hw_gpu_count`` and ``hw_cpu_cores`` gets them from the node's ``gpu_count`` and
    ``cpu_count`` gauges in node-weights, as in the extender's node features and the trainer's samples."""
    names = ["hw_gpu_count", "hw_cpu_cores"]
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.choice([1.0, 2.0], 200), rng.choice([8.0, 16.0], 200)]).astype(np.float32)
    b = xgboost.train({"max_depth": 2, "eta": 0.5}, xgboost.DMatrix(X, label=200.0 / X[:, 0] + X[:, 1],
                                                                      feature_names=names), 40)
    store = DirectoryModelStore(tmp_path)
    r = store.save("gCTF:gpu", booster_to_bytes(b, "ubj"), fmt="ubj", features=names, params={}, metrics={},
                   n_samples=200)
    store.promote("gCTF:gpu", r.version)
    clock = ManualClock(1001.0)
    settings = Settings(scrape_interval_s=1.0, stale_after_scrapes=3.0)
    nodes = NodeStore(10.0, WorkerOptions(), 1.0)
    loop = FeedbackLoop(settings, FeedbackOptions(), clock, SimpleNamespace(store=nodes),  # type: ignore[arg-type]
                        ModelCache(settings, store=store), JoinBuffer(60.0, clock=clock), None)  # type: ignore[arg-type]
    for name, gpus, cores in [("one", 1.0, 8.0), ("two", 2.0, 16.0)]:
        state = nodes.state(name, 0, lambda _k: None)
        for t in range(992, 1001):
            state.update({"node": name, "ts": float(t), "node_class": "gpu", "gpu_model": "Tesla M40",
                          "metrics": {"gpu_count": gpus, "cpu_count": cores}}, partition=0)
    asyncio.run(loop.models.apply({"model_key": "gCTF:gpu", "version": r.version, "sha256": r.sha256}))
    got = {v["node"]: v["predicted_rtt_ms"]["gCTF"] for v in weights_values(loop, clock.now())}
    predictor = loop.models.predictor("gCTF:gpu")
    assert predictor is not None
    for name, gpus, cores in [("one", 1.0, 8.0), ("two", 2.0, 16.0)]:
        row = hardware_features("gpu", "Tesla M40", cpu_cores=cores, gpu_count=gpus)
        assert row["hw_gpu_count"] == gpus and row["hw_cpu_cores"] == cores
        assert got[name] == pytest.approx(float(predictor.predict(matrix([row], names))[0]))
    assert got["one"] > 150.0 > got["two"]


async def test_a_broker_error_while_resetting_an_out_of_range_position_is_retried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The position is out of range, and asking for the partition's start fails too (the broker went away):
    the model-updates task — a worker app task, whose end ends the worker — used to end with that error,
    raised inside the handler of the first; now it pauses and reads again, and resets once the broker answers."""
    tp = TopicPartition(Settings().topic("model-updates"), 0)
    calls = {"beginning": 0, "fetch": 0}
    reset = asyncio.Event()

    class Consumer:
        """Out of range until reset; the partition's start unknown twice (the broker away), then 0."""

        def __init__(self, *_a: object, **_k: object) -> None:
            self.seeks: list[tuple[TopicPartition, int]] = []

        async def start(self) -> None: ...
        async def stop(self) -> None: ...
        def assign(self, _tps: object) -> None: ...
        def assignment(self) -> set[TopicPartition]:
            return {tp}
        async def seek_to_beginning(self, *_tps: object) -> None: ...
        def seek(self, p: TopicPartition, offset: int) -> None:
            self.seeks.append((p, offset))
            reset.set()
        def highwater(self, _p: object) -> int:
            return 0

        async def getmany(self, **_kw: object) -> dict[TopicPartition, list[Any]]:
            calls["fetch"] += 1
            if not self.seeks:  # the position stays out of range until it is reset
                raise OffsetOutOfRangeError({tp: 500})
            await asyncio.sleep(0.01)
            return {}

        async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
            calls["beginning"] += 1
            if calls["beginning"] <= 2:
                raise KafkaTimeoutError()
            return {p: 0 for p in tps}

    monkeypatch.setattr(fm, "AIOKafkaConsumer", Consumer)
    monkeypatch.setattr(fm, "RETRY_S", 0.01)
    settings = Settings(models_dir=str(tmp_path / "models"))
    task = asyncio.ensure_future(fm.follow_model_updates(settings, ModelCache(settings, store=DirectoryModelStore(
        tmp_path / "models"))))
    waiting = asyncio.ensure_future(reset.wait())
    try:
        await asyncio.wait({task, waiting}, timeout=5.0, return_when=asyncio.FIRST_COMPLETED)
        assert not task.done(), task.exception()  # the task (a worker app task) goes on
        assert reset.is_set()
    finally:
        waiting.cancel()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert calls["beginning"] == 3


async def test_a_batch_fetched_is_applied_when_the_position_check_after_it_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """model-updates recreated (as after a wipe): partition 0's position lies beyond its new end, and asking the
    broker for the ends fails (it went away right after answering the fetch). The update fetched on partition 3
    in the same step used to be dropped — the consumer's position already past it, so never applied and the old
    model kept serving; now it is applied, and the check is tried again after a pause."""
    topic = Settings().topic("model-updates")
    tp0, tp3 = TopicPartition(topic, 0), TopicPartition(topic, 3)
    update = {"model_key": "gCTF:gpu", "version": 4, "sha256": "0" * 64, "features": ["cpu_iowait"],
              "metrics": {}, "location": "nowhere", "ts": time.time()}
    rec = SimpleNamespace(topic=topic, partition=3, offset=0, key=b"gCTF:gpu", value=encode("model-updates", update))
    calls = {"ends": 0, "fetch": 0}

    class Consumer:
        """Partition 0 read up to 3 with its end now 0; partition 3 answers one update, once."""

        def __init__(self, *_a: object, **_k: object) -> None: ...
        async def start(self) -> None: ...
        async def stop(self) -> None: ...
        def assign(self, _tps: object) -> None: ...
        def assignment(self) -> set[TopicPartition]:
            return {tp0, tp3}
        async def seek_to_beginning(self, *_tps: object) -> None: ...
        def highwater(self, p: TopicPartition) -> int:
            return 0 if p == tp0 else 1
        async def position(self, p: TopicPartition) -> int:
            return 3 if p == tp0 else 1

        async def getmany(self, **_kw: object) -> dict[TopicPartition, list[Any]]:
            calls["fetch"] += 1
            if calls["fetch"] == 1:
                return {tp3: [rec]}
            await asyncio.sleep(0.01)
            return {}

        async def end_offsets(self, _tps: object) -> dict[TopicPartition, int]:
            calls["ends"] += 1
            raise KafkaConnectionError("the ListOffsets answer lost")

    applied: list[tuple[str, int]] = []

    class Recording(ModelCache):
        async def apply(self, update: dict[str, Any]) -> bool:
            applied.append((update["model_key"], update["version"]))
            return True

    monkeypatch.setattr(fm, "AIOKafkaConsumer", Consumer)
    monkeypatch.setattr(fm, "PositionGuard", functools.partial(fm.PositionGuard, confirm_s=0.0))
    monkeypatch.setattr(fm, "RETRY_S", 0.01)
    settings = Settings(models_dir=str(tmp_path / "models"))
    task = asyncio.ensure_future(fm.follow_model_updates(settings, Recording(settings, store=DirectoryModelStore(
        tmp_path / "models"))))
    try:
        for _ in range(200):
            if applied or task.done():
                break
            await asyncio.sleep(0.01)
        deadline = time.monotonic() + 10.0
        while calls["fetch"] < 3 and not task.done():  # the task reads on after the failed check
            assert time.monotonic() < deadline, f"the task read no further: {calls}"
            await asyncio.sleep(0.01)
        assert not task.done(), task.exception()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert calls["ends"] >= 1  # the check after the fetch did fail
    assert applied == [("gCTF:gpu", 4)]


class Feed:
    """A stand-in model-updates consumer: ``batches`` answered in turn (then nothing, or ``then`` raised), with the
    high watermarks ``high``; ``seen`` is what ``look`` returned at each fetch."""

    def __init__(self, batches: list[dict[TopicPartition, list[Any]]], high: dict[TopicPartition, int],
                 look: Any = None, then: Exception | None = None) -> None:
        self.batches, self.high, self.look, self.then = batches, high, look, then
        self.fetches, self.seen = 0, []  # type: ignore[var-annotated]

    def __call__(self, *_a: object, **_k: object) -> Feed:
        return self

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def assign(self, _tps: object) -> None: ...
    async def seek_to_beginning(self, *_tps: object) -> None: ...

    def assignment(self) -> set[TopicPartition]:
        return set(self.high)

    def highwater(self, p: TopicPartition) -> int:
        return self.high[p]

    async def position(self, p: TopicPartition) -> int:
        return self.high[p]

    async def getmany(self, **_kw: object) -> dict[TopicPartition, list[Any]]:
        self.fetches += 1
        if self.look is not None:
            self.seen.append(self.look())
        if self.fetches <= len(self.batches):
            return self.batches[self.fetches - 1]
        await asyncio.sleep(0.01)
        if self.then is not None:
            raise self.then
        return {}


def announced(topic: str, partition: int, offset: int, update: dict[str, Any]) -> SimpleNamespace:
    value = {**update, "features": FEATURES, "metrics": {}, "location": "nowhere", "ts": time.time()}
    return SimpleNamespace(topic=topic, partition=partition, offset=offset, key=update["model_key"].encode(),
                           value=encode("model-updates", value))


async def until(done: Any, task: asyncio.Future[Any], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert not task.done(), task.exception()
        assert time.monotonic() < deadline, "not seen in time"
        await asyncio.sleep(0.01)


async def test_the_first_read_loads_only_the_newest_version_of_each_key_once_read_to_its_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A restart reads model-updates from its start: every version ever announced, over two fetches. Nothing is
    loaded, and no cold start may be asked, until the partitions are read to their ends; then only the newest
    version of each key is loaded: the versions the registry trimmed are not looked for nor warned about, and
    a newest version the registry lacks still is."""
    topic = Settings().topic("model-updates")
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    store = DirectoryModelStore(tmp_path / "models", keep=5)
    versions = [save(store, "gCTF:gpu", float(k)) for k in range(1, 8)]  # v1 and v2 trimmed since
    missing = {"model_key": "upload:cpu", "version": 3, "sha256": "0" * 64}
    records = [announced(topic, 0, i, u) for i, u in enumerate(versions)]
    settings = Settings(models_dir=str(tmp_path / "models"))
    cache = ModelCache(settings, store=store)
    swaps: list[tuple[str, int]] = []
    cache.on_swap.append(lambda k, v: swaps.append((k, v)))
    feed = Feed([{tp0: records[:4], tp1: [announced(topic, 1, 0, missing)]}, {tp0: records[4:]}],
                {tp0: 7, tp1: 1}, look=lambda: (cache.settled(), cache.version("gCTF:gpu"), cache.has("gCTF:gpu")))
    monkeypatch.setattr(fm, "AIOKafkaConsumer", feed)
    with caplog.at_level(logging.WARNING, logger="app.streams.feedback_models"):
        task = asyncio.ensure_future(fm.follow_model_updates(settings, cache))
        try:
            await until(lambda: feed.fetches >= 3, task)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert feed.seen[:3] == [(False, None, False), (False, None, True), (True, 7, True)]
    assert swaps == [("gCTF:gpu", 7)]
    assert [r.getMessage() for r in caplog.records if "not loaded" in r.getMessage()] == [
        "model upload:cpu v3 not loaded (model 'upload:cpu' version 3 not found in the registry): keeping vNone"]


async def test_a_first_read_the_broker_stops_answering_is_loaded_at_the_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker answers one fetch of model-updates, then nothing: what was read is loaded, and cold starts may
    be asked, once ``START_BOUND_S`` has passed, not before."""
    topic = Settings().topic("model-updates")
    tp0 = TopicPartition(topic, 0)
    store = DirectoryModelStore(tmp_path / "models")
    update = save(store, "gCTF:gpu", 1.0)
    now = [0.0]
    settings = Settings(models_dir=str(tmp_path / "models"))
    cache = ModelCache(settings, store=store, clock=lambda: now[0])
    feed = Feed([{tp0: [announced(topic, 0, 0, update)]}], {tp0: 5}, then=KafkaConnectionError("broker away"))
    monkeypatch.setattr(fm, "AIOKafkaConsumer", feed)
    monkeypatch.setattr(fm, "RETRY_S", 0.01)
    task = asyncio.ensure_future(fm.follow_model_updates(settings, cache))
    try:
        await until(lambda: feed.fetches >= 4, task)
        assert cache.first_pass and cache.version("gCTF:gpu") is None and cache.has("gCTF:gpu")
        assert not cache.settled()
        now[0] = fm.START_BOUND_S
        await until(lambda: cache.version("gCTF:gpu") == update["version"], task)
        assert cache.settled() and not cache.first_pass
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def follow(feed: Feed, settings: Settings, cache: ModelCache, monkeypatch: pytest.MonkeyPatch,
                 done: Any) -> None:
    """Run :func:`fm.follow_model_updates` on ``feed`` until ``done()``."""
    monkeypatch.setattr(fm, "AIOKafkaConsumer", feed)
    task = asyncio.ensure_future(fm.follow_model_updates(settings, cache))
    try:
        await until(done, task)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_rejected_newest_version_leaves_the_newest_good_one_read_serving(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A restart reads v1, v2, v3 of a key; v3 is announced with a sha256 the registry's record does not have.
    v3 is tried and warned about, then v2 loads; v1 is neither loaded nor warned about."""
    topic = Settings().topic("model-updates")
    tp0 = TopicPartition(topic, 0)
    store = DirectoryModelStore(tmp_path / "models", keep=5)
    u1, u2 = save(store, "gCTF:gpu", 1.0), save(store, "gCTF:gpu", 2.0)
    u3 = {**save(store, "gCTF:gpu", 3.0), "sha256": "0" * 64}
    settings = Settings(models_dir=str(tmp_path / "models"))
    cache = ModelCache(settings, store=store)
    swaps: list[tuple[str, int]] = []
    cache.on_swap.append(lambda k, v: swaps.append((k, v)))
    feed = Feed([{tp0: [announced(topic, 0, i, u) for i, u in enumerate((u1, u2, u3))]}], {tp0: 3})
    with caplog.at_level(logging.WARNING, logger="app.streams.feedback_models"):
        await follow(feed, settings, cache, monkeypatch, lambda: cache.settled() and feed.fetches >= 3)
    assert cache.version("gCTF:gpu") == 2 and swaps == [("gCTF:gpu", 2)] and not cache.older
    assert [r.getMessage().split(" (")[0] for r in caplog.records if "not loaded" in r.getMessage()] == [
        "model gCTF:gpu v3 not loaded"]


async def test_a_new_key_whose_newest_version_of_a_batch_is_rejected_gets_the_older_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first pass, a new key's v1 (good) and v2 (bad sha256) are fetched together: v1 serves; then v3
    (good) supersedes it."""
    topic = Settings().topic("model-updates")
    tp0 = TopicPartition(topic, 0)
    store = DirectoryModelStore(tmp_path / "models", keep=5)
    u1 = save(store, "gCTF:gpu", 1.0)
    u2 = {**save(store, "gCTF:gpu", 2.0), "sha256": "0" * 64}
    u3 = save(store, "gCTF:gpu", 3.0)
    settings = Settings(models_dir=str(tmp_path / "models"))
    cache = ModelCache(settings, store=store)
    feed = Feed([{}, {tp0: [announced(topic, 0, 0, u1), announced(topic, 0, 1, u2)]}, {}, {tp0: [
        announced(topic, 0, 2, u3)]}], {tp0: 0}, look=lambda: cache.version("gCTF:gpu"))
    await follow(feed, settings, cache, monkeypatch, lambda: feed.fetches >= 5)
    assert feed.seen[2:5] == [1, 1, 3] and not cache.older


async def test_a_rejected_version_waiting_for_the_registry_falls_back_to_the_older_one(tmp_path: Path) -> None:
    """v2 is deferred (registry away) and v1, read with it, kept; once the registry is back v2 is rejected (its
    sha256 is not the record's): v1 is loaded, and the key had a model all along."""
    real = DirectoryModelStore(tmp_path / "models")
    u1 = save(real, "gCTF:gpu", 1.0)
    u2 = {**save(real, "gCTF:gpu", 2.0), "sha256": "0" * 64}
    away = [True]

    class Flaky:
        def __getattr__(self, name: str) -> Any:
            if away[0]:
                raise RegistryUnavailableError("registry away")
            return getattr(real, name)

    cache = ModelCache(Settings(retry_max_backoff_s=0.05), store=Flaky())  # type: ignore[arg-type]

    async def run() -> None:
        await cache.apply_all([u1, u2])
        assert cache.pending == {"gCTF:gpu": u2} and cache.has("gCTF:gpu") and cache.version("gCTF:gpu") is None
        away[0] = False
        deadline = time.monotonic() + 5.0
        while cache.version("gCTF:gpu") is None:
            assert time.monotonic() < deadline, "v1 not loaded"
            await asyncio.sleep(0.01)
        await cache.close()

    await run()
    assert cache.version("gCTF:gpu") == 1 and not cache.pending and not cache.older


class StuckFeed(Feed):
    """Partition 1's high watermark is above its position, and no fetch returns a record of it (Tansu after a
    memory-only broker restart, runbook §7): it is never read to its end."""

    async def position(self, p: TopicPartition) -> int:
        return 0 if p.partition == 1 else self.high[p]


async def test_a_partition_never_read_to_its_end_holds_back_the_cold_starts_not_the_other_models(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The keys of partition 0 are loaded as soon as it is read to its end; partition 1 never is: cold starts wait
    for the bound, and when it passes one WARNING names the partition, though nothing asks whether they may."""
    topic = Settings().topic("model-updates")
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    store = DirectoryModelStore(tmp_path / "models", keep=5)
    u1, u2 = save(store, "gCTF:gpu", 1.0), save(store, "gCTF:gpu", 2.0)
    now = [0.0]
    settings = Settings(models_dir=str(tmp_path / "models"))
    cache = ModelCache(settings, store=store, clock=lambda: now[0])
    swaps: list[tuple[str, int]] = []
    cache.on_swap.append(lambda k, v: swaps.append((k, v)))
    feed = StuckFeed([{tp0: [announced(topic, 0, 0, u1)]}, {tp0: [announced(topic, 0, 1, u2)]}], {tp0: 2, tp1: 1})
    monkeypatch.setattr(fm, "AIOKafkaConsumer", feed)
    with caplog.at_level(logging.INFO, logger="app.streams.feedback_models"):
        task = asyncio.ensure_future(fm.follow_model_updates(settings, cache))
        try:
            await until(lambda: cache.version("gCTF:gpu") == 2, task)
            assert cache.first_pass and swaps == [("gCTF:gpu", 2)]  # read to its end: loaded, newest only
            now[0] = fm.START_BOUND_S
            await until(lambda: not cache.first_pass and feed.fetches >= 10, task)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    lines = [r.getMessage() for r in caplog.records if "cold starts are asked" in r.getMessage()]
    assert lines == ["model-updates not read to their end (partition(s) 1) within 30 s of start: cold starts are"
                     " asked from now on (1 model(s) in use, 0 waiting for the registry)"], lines
    assert cache.settled()


async def test_a_tombstone_read_beside_an_update_not_loaded_yet_says_it_will_serve(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A first pass reads an update and a tombstone of its key together, before the partition's end: the tombstone's
    line says the version read will serve, not that the key has no model."""
    topic = Settings().topic("model-updates")
    tp0 = TopicPartition(topic, 0)
    store = DirectoryModelStore(tmp_path / "models")
    update = save(store, "gCTF:gpu", 1.0)
    tombstone = SimpleNamespace(topic=topic, partition=0, offset=1, key=b"gCTF:gpu", value=None)
    settings = Settings(models_dir=str(tmp_path / "models"))
    cache = ModelCache(settings, store=store)
    feed = Feed([{tp0: [announced(topic, 0, 0, update), tombstone]}], {tp0: 3})
    with caplog.at_level(logging.INFO, logger="app.streams.feedback_models"):
        await follow(feed, settings, cache, monkeypatch, lambda: feed.fetches >= 2)
    assert [r.getMessage().split("(")[-1] for r in caplog.records if "tombstone" in r.getMessage()] == [
        "v1 announced serves once loaded)"]
