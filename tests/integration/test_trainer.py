"""The trainer on the real broker and a real Redis: cold start promotes v1, a worse challenger is rejected; an event
is committed only once its retrain ended."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import xgboost
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from fault_stack import recreate_topic

from app.clock import ManualClock
from app.config import Settings
from app.contracts import contract, decode, encode, topics_dir
from app.kafka.batches import partition_for
from app.kafka.embedded import free_port
from app.model.train import booster_to_bytes
from app.registry.redis_store import RedisModelStore
from app.registry.store import load_predictor
from app.trainer.history import SampleHistory
from app.trainer.registry import ModelRegistry, update_message
from app.trainer.service import GROUP_ID, TrainerService

pytestmark = pytest.mark.integration

KEY = "gCTF:gpu"
GPUS = ("Tesla K20c", "Tesla M40", "NVIDIA GeForce RTX 4090")
FAST = {"n_estimators": 40}


def samples(n: int, start: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    """gCTF samples whose RTT depends on GPU utilisation and memory used (plus 2 % noise)."""
    out = []
    for i in range(start, start + n):
        util, mem = float(rng.uniform(0, 100)), float(rng.uniform(0, 8000))
        rtt = (300.0 + 6.0 * util + 0.05 * mem) * float(rng.normal(1.0, 0.02))
        out.append({
            "model_key": KEY, "task_id": f"task-{i}", "app": "gCTF", "node": f"gpu-{i % 3}", "node_class": "gpu",
            "gpu_model": GPUS[i % 3], "started_ts": 1_700_000_000.0 + i, "rtt_ms": rtt, "input_size_mb": 64.0,
            "window_s": 30.0, "features": {"nvidia_smi_utilization_gpu__mean": util,
                                           "nvidia_smi_memory_used__mean": mem,
                                           "cpu_iowait__mean": float(rng.uniform(0, 5))},
        })
    return out


def event(key: str, reason: str, onset: float | None = None) -> bytes:
    return encode("retrain-events", {"model_key": key, "reason": reason, "cumulative_error": 0.7,
                                     "threshold": 0.5, "ts": time.time(), "onset_ts": onset})


async def produce(settings: Settings, topic: str, items: list[tuple[str, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    await producer.start()
    try:
        for key, value in items:
            await producer.send(settings.topic(topic), value, key=key.encode())
        await producer.flush()
    finally:
        await producer.stop()


async def dead_letters(settings: Settings, n: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The first ``n`` values of the dead-letters topic."""
    consumer = AIOKafkaConsumer(settings.topic("dead-letters"), bootstrap_servers=settings.bootstrap_servers,
                                group_id=None, auto_offset_reset="earliest")
    await consumer.start()
    out: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(out) < n and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=200)
            out += [decode("dead-letters", r.value, strict=True) for recs in batches.values() for r in recs]
    finally:
        await consumer.stop()
    return out


async def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.fixture
async def updates(kafka_settings: Settings) -> AsyncIterator[AIOKafkaConsumer]:
    consumer = AIOKafkaConsumer(kafka_settings.topic("model-updates"),
                                bootstrap_servers=kafka_settings.bootstrap_servers, group_id=None,
                                auto_offset_reset="earliest")
    await consumer.start()
    yield consumer
    await consumer.stop()


async def drain(consumer: AIOKafkaConsumer, seconds: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        batches = await consumer.getmany(timeout_ms=200)
        out += [decode("model-updates", r.value, strict=True) for recs in batches.values() for r in recs]
        if out:
            break
    return out


def excellent_champion(store: RedisModelStore, rows: list[dict[str, Any]], names: tuple[str, ...]) -> int:
    """A model fitted on every row the challenger will be judged on: hard to beat by 2 %."""
    h = SampleHistory()
    for s in rows:
        h.add(s)
    ds = h.dataset(KEY)
    X = ds.columns(names)
    booster = xgboost.train({"max_depth": 10, "eta": 0.3, "base_score": float(ds.y.mean())},
                            xgboost.DMatrix(X, label=ds.y, feature_names=list(names)), 300)
    rec = store.save(KEY, booster_to_bytes(booster), fmt="ubj", features=names, params={}, metrics={},
                     n_samples=len(ds))
    store.promote(KEY, rec.version)
    return rec.version


async def test_cold_start_promotes_then_worse_challenger_is_rejected(
        kafka_settings: Settings, redis_url: str, updates: AIOKafkaConsumer) -> None:
    settings = dataclasses.replace(kafka_settings, redis_url=redis_url)
    store = RedisModelStore(redis_url, namespace=f"t{uuid.uuid4().hex[:10]}")
    rng = np.random.default_rng(1)
    first = samples(700, 0, rng)  # 560 fit rows: metric columns are candidates from 500 (METRIC_MIN_ROWS)
    await produce(settings, "training-samples", [(KEY, encode("training-samples", s)) for s in first])
    await produce(settings, "retrain-events", [
        ("upload:cpu", event("upload:cpu", "cold_start")),
        (KEY, event(KEY, "cold_start", onset=time.time() - 30.0)),
        (KEY, b"{not json"),
    ])

    service = TrainerService(settings, registry=ModelRegistry(store=store), train_params=FAST,
                             catch_up_timeout_s=15.0)
    async with service:
        # 1. cold start: version 1 announced, current in the registry, the key with no samples skipped
        got = await drain(updates, 30.0)
        assert [(m["model_key"], m["version"]) for m in got] == [(KEY, 1)]
        msg = got[0]
        assert msg["format"] == "ubj" and msg["onset_ts"] is not None and msg["metrics"]["mape"] < 0.1
        assert "nvidia_smi_utilization_gpu__mean" in msg["features"]
        predictor, record = load_predictor(store, KEY)
        assert record.version == 1 and record.sha256 == msg["sha256"] and predictor.feature_names == tuple(
            msg["features"])
        await wait_for(lambda: len(service.outcomes) >= 2, 10.0, "both cold-start outcomes")
        by_key = {o.model_key: o.outcome for o in service.outcomes}
        assert by_key == {KEY: "promoted", "upload:cpu": "insufficient_data"}
        reg = service.metrics.registry
        assert reg.get_sample_value("rtt_trainer_model_version", {"model_key": KEY}) == 1.0
        assert reg.get_sample_value("rtt_trainer_drift_to_promotion_seconds_count") == 1.0
        assert reg.get_sample_value("rtt_trainer_drift_to_promotion_seconds_sum") >= 30.0
        assert reg.get_sample_value("rtt_trainer_bad_messages_total",
                                    {"topic": "retrain-events", "reason": "invalid_json"}) == 1.0
        letters = await dead_letters(settings, 1)
        assert [(d["topic"], d["reason"], base64.b64decode(d["raw"])) for d in letters] == [
            (settings.topic("retrain-events"), "invalid_json", b"{not json")]

        # 2. an excellent champion is in service: the challenger is rejected, nothing is announced
        second = samples(200, 700, rng)
        injected = excellent_champion(store, first + second, tuple(msg["features"]))
        await produce(settings, "training-samples", [(KEY, encode("training-samples", s)) for s in second])
        await produce(settings, "retrain-events", [(KEY, event(KEY, "drift", onset=time.time()))])
        await wait_for(lambda: len(service.outcomes) >= 3, 30.0, "the drift retrain")
        rejected = service.outcomes[2]
        assert (rejected.outcome, rejected.verdict and rejected.verdict.reason) == ("rejected", "not_better")
        assert rejected.verdict is not None and rejected.verdict.champion_rmse_ms is not None
        assert rejected.verdict.challenger_rmse_ms >= 0.98 * rejected.verdict.champion_rmse_ms
        assert service.history.count(KEY) == 900  # the retrain saw every sample produced before its event
        assert await drain(updates, 1.0) == []
        assert store.current(KEY).version == injected
        assert reg.get_sample_value("rtt_trainer_retrains_total", {"reason": "drift", "outcome": "rejected"}) == 1.0

        # 3. events for a key that is training are coalesced
        t1 = service.submit({"model_key": KEY, "reason": "manual", "ts": time.time()})
        await asyncio.sleep(0.05)  # the retrain has started
        t2 = service.submit({"model_key": KEY, "reason": "growth", "ts": time.time()})
        assert t1 is not None and t2 is None
        assert (await t1).outcome == "rejected"
        assert reg.get_sample_value("rtt_trainer_events_coalesced_total") == 1.0
        # the coalesced event is dropped: the key's next retrain runs on its own event, not the older one
        t3 = service.submit({"model_key": KEY, "reason": "drift", "ts": time.time(), "onset_ts": time.time()})
        assert t3 is not None and (await t3).reason == "drift"
    store.close()


def test_cli_runs_until_sigterm(kafka_settings: Settings, redis_url: str) -> None:
    """The trainer runs until SIGTERM, serving /metrics and /healthz (its liveness probe) meanwhile."""
    port = free_port()
    env = {**os.environ, "RTT_KAFKA_BOOTSTRAP": kafka_settings.bootstrap_servers,
           "RTT_TOPIC_PREFIX": kafka_settings.topic_prefix, "REDIS_URL": redis_url, "RTT_TRAINER_CPUS": "0",
           "RTT_METRICS_PORT": str(port), "RTT_METRICS_HOST": "127.0.0.1"}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", "trainer"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        lines = []
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline().decode()
            lines.append(line)
            if "trainer started" in line or not line:
                break
        assert any("trainer started" in x for x in lines), "".join(lines)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            assert (response.status, response.read()) == (200, b"ok\n")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert b"rtt_trainer_samples " in response.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_a_registry_that_lost_its_data_is_brought_back_above_what_was_announced(
        kafka_settings: Settings, redis_url: str, updates: AIOKafkaConsumer) -> None:
    """Redis restarted empty, then from an older snapshot, a version promoted without announcement, and
    model-updates recreated empty: each time the trainer's registry check makes the registry's current version
    the newest announced again, and no announcement reuses or goes below a version the workers and extenders
    already hold."""
    settings = dataclasses.replace(kafka_settings, redis_url=redis_url)
    ns = f"t{uuid.uuid4().hex[:10]}"
    store = RedisModelStore(redis_url, namespace=ns)
    raw = redis.Redis.from_url(redis_url)

    def keys() -> list[bytes]:
        return list(raw.scan_iter(f"{ns}:*"))

    rng = np.random.default_rng(2)
    await produce(settings, "training-samples", [(KEY, encode("training-samples", s)) for s in samples(700, 0, rng)])
    await produce(settings, "retrain-events", [(KEY, event(KEY, "cold_start"))])
    service = TrainerService(settings, registry=ModelRegistry(store=store), train_params=FAST,
                             catch_up_timeout_s=15.0, registry_check_s=0.5)
    async with service:
        got = await drain(updates, 30.0)
        assert [m["version"] for m in got] == [1]

        # 1. Redis restarted empty: no model at all; one is trained from the history, as v2 (the counter
        #    restarted at 1, which every process already holds)
        raw.delete(*keys())
        got = await drain(updates, 60.0)
        assert [m["version"] for m in got] == [2]
        assert store.current(KEY).version == 2 and store.current(KEY).sha256 == got[0]["sha256"]
        lost = [o for o in service.outcomes if o.reason == "registry"]
        assert [(o.outcome, o.version) for o in lost] == [("promoted", 2)]

        # 2. v3 promoted and announced, then Redis restarted from a snapshot taken at v2: v2 is saved again as v4
        snapshot = {k: raw.dump(k) for k in keys()}
        blob, record = store.load(KEY)
        v3 = store.promote(KEY, store.save(KEY, blob + b" ", fmt="json", features=list(record.features),
                                           params={}, metrics={}, n_samples=1).version)
        await produce(settings, "model-updates", [(KEY, encode("model-updates", {
            **update_message(v3), "ts": time.time(), "onset_ts": None}))])
        assert [m["version"] for m in await drain(updates, 10.0)] == [3]
        raw.delete(*keys())
        for k, dumped in snapshot.items():
            raw.restore(k, 0, dumped)
        got = await drain(updates, 30.0)
        assert [m["version"] for m in got] == [4]
        assert got[0]["sha256"] == record.sha256  # v2's model, under a version above v3
        assert store.current(KEY).version == 4

        # 3. a version promoted in the registry and never announced: announced after two checks
        v5 = store.promote(KEY, store.save(KEY, blob, fmt="ubj", features=list(record.features), params={},
                                           metrics={}, n_samples=1).version)
        got = await drain(updates, 10.0)
        assert [m["version"] for m in got] == [v5.version] == [5]
        await asyncio.sleep(1.5)
        assert await drain(updates, 0.5) == []  # in agreement: nothing more

        # 4. the broker lost model-updates (topic recreated empty): the registry's current is announced again
        await recreate_topic(settings, "model-updates")
        await updates.seek_to_beginning()
        got = await drain(updates, 20.0)
        assert [(m["version"], m["sha256"]) for m in got] == [(5, v5.sha256)]
        assert service.metrics.registry.get_sample_value("rtt_trainer_retrains_total",
                                                         {"reason": "registry", "outcome": "promoted"}) == 2.0
    store.close()
    raw.close()


@pytest.mark.parametrize(("contracts", "reason"), [("shipped", "schema"), ("without the key pattern", "bad_model_key")])
async def test_a_key_the_registry_could_not_store_is_dead_lettered_before_training(
        kafka_settings: Settings, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, contracts: str,
        reason: str) -> None:
    """Samples and a cold-start event of app ``POST /upload`` (a span name): refused, not trained into a model the
    registry then refuses. The shipped contracts refuse the app; where a deployment's contracts lack the
    pattern, the trainer checks the key itself."""
    settings = dataclasses.replace(kafka_settings, redis_url=redis_url)
    if contracts != "shipped":
        shutil.copytree(topics_dir(), tmp_path / "topics")
        path = tmp_path / "topics" / "retrain-events.json"
        doc = json.loads(path.read_text())
        del doc["value_schema"]["properties"]["model_key"]["pattern"]
        path.write_text(json.dumps(doc))
        monkeypatch.setenv("RTT_TOPICS_DIR", str(tmp_path / "topics"))
    key = "POST /upload:cpu"
    rows = [{**s, "model_key": key, "app": "POST /upload", "node_class": "cpu", "gpu_model": None}
            for s in samples(700, 0, np.random.default_rng(3))]
    await produce(settings, "training-samples", [(key, encode("training-samples", s, check=False)) for s in rows])
    await produce(settings, "retrain-events", [(key, encode("retrain-events", {
        "model_key": key, "reason": "cold_start", "cumulative_error": 0.0, "threshold": 0.5, "ts": time.time(),
        "onset_ts": None}, check=False))])
    store = RedisModelStore(redis_url, namespace=f"t{uuid.uuid4().hex[:10]}")
    service = TrainerService(settings, registry=ModelRegistry(store=store), train_params=FAST,
                             catch_up_timeout_s=15.0, registry_check_s=0)
    async with service:
        letters = await dead_letters(settings, 701)
        assert [(d["topic"], d["reason"], d["key"]) for d in letters if "retrain" in d["topic"]] == [
            (settings.topic("retrain-events"), reason, key)]
        assert sorted(d["offset"] for d in letters if d["topic"] == settings.topic("training-samples")) == list(
            range(700))  # the samples, read from the topic's start, dead-lettered each once
        reg = service.metrics.registry
        assert reg.get_sample_value("rtt_trainer_bad_messages_total",
                                    {"topic": "retrain-events", "reason": reason}) == 1.0
        await wait_for(lambda: reg.get_sample_value("rtt_trainer_bad_messages_total", {
            "topic": "training-samples", "reason": "schema"}) == 700.0, 10.0, "the samples refused")
        assert not service.outcomes and service.history.count(key) == 0 and store.keys() == []
    store.close()


async def test_bad_samples_and_model_updates_are_dead_lettered_once_across_restarts(
        kafka_settings: Settings, redis_url: str) -> None:
    """training-samples and model-updates are read from their start by every trainer: a bad message there goes
    to dead-letters the first time a trainer reads it (a mark in Redis), and is counted, not sent again, by the
    trainers that read it later; a new bad message is dead-lettered when it comes."""
    settings = dataclasses.replace(kafka_settings, redis_url=redis_url)
    good = samples(3, 0, np.random.default_rng(5))
    await produce(settings, "training-samples", [(KEY, encode("training-samples", good[0])), (KEY, b"{not json"),
                                                 (KEY, encode("training-samples", good[1]))])
    await produce(settings, "model-updates", [(KEY, b'{"model_key": "gCTF:gpu"}')])
    store = RedisModelStore(redis_url, namespace=f"t{uuid.uuid4().hex[:10]}")

    def counted(reg: Any, name: str) -> dict[tuple[str, str], float]:
        return {(x.labels["topic"], x.labels["reason"]): x.value for m in reg.collect() for x in m.samples
                if x.name == name and x.value}

    async def run(bad: int, good: int) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
        """A trainer that reads both topics: the bad messages it read and the dead letters it stored."""
        service = TrainerService(settings, registry=ModelRegistry(store=store), catch_up_timeout_s=15.0,
                                 registry_check_s=0)
        async with service:
            reg = service.metrics.registry
            await wait_for(lambda: sum(counted(reg, "rtt_trainer_bad_messages_total").values()) == bad
                           and service.history.count(KEY) == good, 15.0, "every message read")
            await asyncio.sleep(0.5)  # a dead letter would be on its way by now
            return counted(reg, "rtt_trainer_bad_messages_total"), counted(reg, "rtt_trainer_dead_letters_total")

    first = {("training-samples", "invalid_json"): 1.0, ("model-updates", "schema"): 1.0}
    assert await run(2, 2) == (first, first)
    letters = await dead_letters(settings, 2)
    assert sorted((d["topic"], d["offset"], base64.b64decode(d["raw"])) for d in letters) == [
        (settings.topic("model-updates"), 0, b'{"model_key": "gCTF:gpu"}'),
        (settings.topic("training-samples"), 1, b"{not json")]
    await produce(settings, "training-samples", [(KEY, b"[]"), (KEY, encode("training-samples", good[2]))])
    # a second trainer reads all of them again: each counted, only the new bad sample dead-lettered
    read, stored = await run(3, 3)
    assert read == {**first, ("training-samples", "not_an_object"): 1.0}
    assert stored == {("training-samples", "not_an_object"): 1.0}
    letters = await dead_letters(settings, 4, timeout_s=3.0)
    assert len(letters) == 3 and [d["offset"] for d in letters if base64.b64decode(d["raw"]) == b"[]"] == [3]
    store.close()


async def test_an_idle_key_s_history_is_dropped_and_a_new_sample_starts_it_again(
        kafka_settings: Settings, redis_url: str) -> None:
    """RTT_TRAINER_KEY_IDLE_S: a key no sample arrived for that long (the trainer's clock) loses its history; a
    key still fed keeps it. Its model stays current: a retrain on the few samples since is insufficient_data."""
    settings = dataclasses.replace(kafka_settings, redis_url=redis_url)
    store = RedisModelStore(redis_url, namespace=f"t{uuid.uuid4().hex[:10]}")
    rng = np.random.default_rng(3)
    rows = samples(40, 0, rng)
    champion = excellent_champion(store, rows, ("nvidia_smi_utilization_gpu__mean",))
    live = [{**s, "model_key": "upload:cpu", "app": "upload", "node_class": "cpu", "gpu_model": None}
            for s in samples(11, 100, rng)]
    clock = ManualClock(time.time())
    service = TrainerService(settings, registry=ModelRegistry(store=store), clock=clock, key_idle_s=100.0,
                             registry_check_s=0, catch_up_timeout_s=5.0)

    def send(items: list[dict[str, Any]]) -> Any:
        return produce(settings, "training-samples", [(s["model_key"], encode("training-samples", s)) for s in items])

    async with service:
        await send(rows + live[:10])
        await wait_for(lambda: service.history.count(KEY) == 40 and service.history.count("upload:cpu") == 10,
                       10.0, "the samples")
        clock.advance(60.0)
        await send(live[10:])  # upload:cpu gets one more sample; gCTF:gpu none
        await wait_for(lambda: service.history.count("upload:cpu") == 11, 10.0, "the new sample")
        clock.advance(60.0)  # gCTF:gpu idle 120 s, upload:cpu 60 s
        reg = service.metrics.registry
        await wait_for(lambda: service.history.count(KEY) == 0, 10.0, "the idle key dropped")
        assert service.history.keys() == ["upload:cpu"]
        assert reg.get_sample_value("rtt_trainer_keys_dropped_total") == 1.0
        await wait_for(lambda: reg.get_sample_value("rtt_trainer_samples") == 11.0, 5.0, "the samples gauge")
        assert reg.get_sample_value("rtt_trainer_history_bytes") == service.history.nbytes > 0
        assert reg.get_sample_value("rtt_trainer_key_samples_total", {"model_key": "upload:cpu"}) == 11.0
        assert reg.get_sample_value("rtt_trainer_key_samples_total", {"model_key": KEY}) is None  # went with it

        await send(samples(1, 500, rng))  # the key comes back: its history starts from this sample
        await wait_for(lambda: service.history.count(KEY) == 1, 10.0, "the returning key's sample")
        assert reg.get_sample_value("rtt_trainer_key_samples_total", {"model_key": KEY}) == 1.0
        outcome = service.submit({"model_key": KEY, "reason": "drift", "ts": clock.now(), "onset_ts": None})
        assert outcome is not None and (await outcome).outcome == "insufficient_data"
        assert store.current(KEY).version == champion  # the model in service stays the champion
    store.close()


class GatedTrainer(TrainerService):
    """A trainer whose training waits for ``gate`` (a retrain as long as the test wants) and that records the events
    handed to it. One stopped at the group's generation 0 does not leave it (aiokafka leaves from generation 1 on, and
    Tansu starts at 0): a short session lets the next join go on sooner."""

    session_timeout_ms = 3_000

    def __init__(self, *args: Any, gate: threading.Event, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = gate
        self.training = threading.Event()
        self.submitted: list[tuple[str, str]] = []

    def _train_and_judge(self, *args: Any, **kwargs: Any) -> Any:
        self.training.set()
        self.gate.wait(60.0)
        return super()._train_and_judge(*args, **kwargs)

    def submit(self, event: dict[str, Any], *args: Any) -> Any:
        self.submitted.append((event["model_key"], event["reason"]))
        return super().submit(event, *args)


async def test_a_retrain_event_is_committed_only_once_its_retrain_ended(
        kafka_settings: Settings, redis_url: str, updates: AIOKafkaConsumer) -> None:
    """A trainer stopped while a retrain runs leaves its event uncommitted: the next trainer retrains it. A retrain
    that ended is committed: a trainer started after it does not retrain it again."""
    settings = dataclasses.replace(kafka_settings, redis_url=redis_url)
    store = RedisModelStore(redis_url, namespace=f"t{uuid.uuid4().hex[:10]}")
    other = "upload:gpu"  # no samples (insufficient_data at once), and on the partition of KEY's events
    n = contract("retrain-events").partitions
    assert partition_for(other.encode(), n) == partition_for(KEY.encode(), n)
    rng = np.random.default_rng(4)
    await produce(settings, "training-samples", [(KEY, encode("training-samples", s)) for s in samples(300, 0, rng)])
    await produce(settings, "retrain-events", [(KEY, event(KEY, "cold_start"))])
    gate = threading.Event()

    def trainer() -> GatedTrainer:
        return GatedTrainer(settings, registry=ModelRegistry(store=store), train_params=FAST, catch_up_timeout_s=15.0,
                            registry_check_s=0, gate=gate)

    first = trainer()
    await first.start()
    try:
        await wait_for(first.training.is_set, 30.0, "the first trainer's retrain")
    finally:
        gate.set()  # the training thread ends; the retrain itself is cancelled by stop(), before it registers
        await first.stop()
    assert not first.outcomes and store.current(KEY) is None

    second = trainer()
    async with second:
        got = await drain(updates, 30.0)
        assert [(m["model_key"], m["version"]) for m in got] == [(KEY, 1)]
        await wait_for(lambda: bool(second.outcomes), 5.0, "the second trainer's outcome")
        assert [(o.reason, o.outcome) for o in second.outcomes] == [("cold_start", "promoted")]

    third = trainer()
    async with third:
        await produce(settings, "retrain-events", [(other, event(other, "cold_start"))])
        await wait_for(lambda: bool(third.outcomes), 30.0, "the third trainer's outcome")
        assert third.submitted == [(other, "cold_start")]  # KEY's event, before it on the partition, was committed
        assert [(o.model_key, o.outcome) for o in third.outcomes] == [(other, "insufficient_data")]
    store.close()


async def test_a_committed_offset_beyond_the_partition_s_end_is_reset_and_counted(
        kafka_settings: Settings, redis_url: str) -> None:
    """The group's committed offset of retrain-events lies beyond the partition's end (the topic was recreated, the
    group's offsets kept): the trainer reads the partition from its start, logs and counts the reset."""
    settings = dataclasses.replace(kafka_settings, redis_url=redis_url)
    n = contract("retrain-events").partitions
    tp = TopicPartition(settings.topic("retrain-events"), partition_for(KEY.encode(), n))
    group = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers, group_id=settings.topic_prefix + GROUP_ID,
                             enable_auto_commit=False)
    await group.start()
    try:
        group.assign([tp])
        await group.commit({tp: 100})
    finally:
        await group.stop()
    store = RedisModelStore(redis_url, namespace=f"t{uuid.uuid4().hex[:10]}")
    service = GatedTrainer(settings, registry=ModelRegistry(store=store), registry_check_s=0, catch_up_timeout_s=5.0,
                           gate=threading.Event())
    async with service:
        reg = service.metrics.registry
        labels = {"client": "trainer-events", "topic": "retrain-events", "reason": "beyond_end"}
        await wait_for(lambda: reg.get_sample_value("rtt_kafka_position_resets_total", labels) == 1.0, 30.0,
                       "the reset")
        reasons = ["drift", "growth", "manual"]
        await produce(settings, "retrain-events", [(KEY, event(KEY, r)) for r in reasons])
        await wait_for(lambda: len(service.submitted) == 3, 10.0, "the three events")
        assert service.submitted == [(KEY, r) for r in reasons]
    store.close()


async def test_a_retrain_event_s_age_is_judged_from_when_its_record_was_produced(
        kafka_settings: Settings, redis_url: str) -> None:
    """An event sent long after its ``ts`` (the close of the error period that signalled it: staged, then sent once
    its checkpoint was stored, after an outage) is retrained; one whose record was produced more than
    ``max_event_age_s`` ago (read again long after) is skipped as stale."""
    settings = dataclasses.replace(kafka_settings, redis_url=redis_url)
    store = RedisModelStore(redis_url, namespace=f"t{uuid.uuid4().hex[:10]}")
    two_hours_ago = time.time() - 7200.0
    old_ts = encode("retrain-events", {"model_key": KEY, "reason": "drift", "cumulative_error": 0.7,
                                       "threshold": 0.5, "ts": two_hours_ago, "onset_ts": None})
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    await producer.start()
    try:
        topic = settings.topic("retrain-events")
        await producer.send(topic, event(KEY, "manual"), key=KEY.encode(), timestamp_ms=int(two_hours_ago * 1000))
        await producer.send(topic, old_ts, key=KEY.encode())  # the same partition, after the old record
        await producer.flush()
    finally:
        await producer.stop()
    gate = threading.Event()
    gate.set()
    service = GatedTrainer(settings, registry=ModelRegistry(store=store), registry_check_s=0, catch_up_timeout_s=5.0,
                           gate=gate)
    async with service:
        await wait_for(lambda: bool(service.submitted), 30.0, "the event sent late")
        await asyncio.sleep(0.5)
        assert service.submitted == [(KEY, "drift")]
    store.close()


class SlowCheckTrainer(TrainerService):
    """A trainer whose check after each fetch waits on the broker (as confirming a position beyond the end does)."""

    async def _fetch(self, *args: Any, **kw: Any) -> dict[Any, list[Any]]:
        batches = await super()._fetch(*args, **kw)
        await asyncio.sleep(0.06)
        return batches


async def test_catch_up_returns_once_every_sample_is_in_the_history(
        kafka_settings: Settings, redis_url: str) -> None:
    """Samples produced as one batch of more records than one read takes (5,000) are all in the history when the
    catch-up before a save returns, also when the loop waits on the broker between a fetch and applying it, and
    on a broker whose ListOffsets answers the last batch's first offset + 1 (the embedded one)."""
    settings = dataclasses.replace(kafka_settings, redis_url=redis_url)
    rows = samples(12_000, 0, np.random.default_rng(5))
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers, linger_ms=5_000,
                                max_batch_size=16 << 20, max_request_size=16 << 20)
    await producer.start()
    try:  # one key, one partition, one batch: sent together within the linger
        sent = [await producer.send(settings.topic("training-samples"), encode("training-samples", s),
                                    key=KEY.encode()) for s in rows]
        await producer.flush()
        offsets = {(await f).offset for f in sent}
    finally:
        await producer.stop()
    assert offsets == set(range(len(rows)))
    service = SlowCheckTrainer(settings, registry=ModelRegistry(store=RedisModelStore(
        redis_url, namespace=f"t{uuid.uuid4().hex[:10]}")), registry_check_s=0, catch_up_timeout_s=15.0)
    async with service:
        assert await service.catch_up()
        assert service.history.count(KEY) == len(rows)
