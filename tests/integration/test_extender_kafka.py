"""The extender against the real embedded broker and a real redis-server.

node-features, node-weights and a model-updates for a model saved in the registry go on the topics; the
extender becomes ready, ranks a fast node above a slow one, publishes rtt-predictions, and a restarted
extender is ready from Redis as soon as it has started. Messages of a newer release, with fields this one
does not know, reach the view all the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from app.config import Settings
from app.contracts.codec import decode, encode
from app.contracts.unknown import UNKNOWN_FIELDS
from app.extender.options import ExtenderOptions
from app.extender.protocol import parse_args
from app.extender.server import running
from app.extender.service import ExtenderService
from app.model.train import booster_to_bytes, train_model
from app.registry.store import open_store
from app.scheduler.cache import CacheKeys, load_view, store_features, store_weights

pytestmark = pytest.mark.integration

POD = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "kube" / "pod_gctf.json").read_text())
FEATURES = ("load__mean", "hw_gpu_fp32_tflops", "task_input_size_mb")
NODES = {"gpu-slow": ("Tesla K20c", 0.9), "gpu-fast": ("NVIDIA GeForce RTX 4090", 0.1)}


def rtt_ms(load: np.ndarray, tflops: np.ndarray, size: np.ndarray) -> np.ndarray:
    return 50.0 + 400.0 * load + 2000.0 / tflops + 0.2 * size


def train_and_register(settings: Settings) -> dict[str, Any]:
    """A small real XGBoost model of gCTF on GPUs, saved + promoted in the registry; its model-updates value."""
    rng = np.random.default_rng(7)
    n = 400
    load = rng.uniform(0, 1, n)
    tflops = rng.choice([3.52, 7.0, 82.6], n)
    size = rng.uniform(100, 1000, n)
    X = np.column_stack([load, tflops, size]).astype(np.float32)
    result = train_model(X, rtt_ms(load, tflops, size), FEATURES, "gpu")
    store = open_store(settings)
    record = store.save("gCTF:gpu", booster_to_bytes(result.booster), fmt="ubj", features=FEATURES,
                        params=result.params, metrics=result.metrics, n_samples=n)
    store.promote("gCTF:gpu", record.version)
    return {"model_key": record.model_key, "version": record.version, "sha256": record.sha256,
            "features": list(record.features), "metrics": record.metrics, "location": record.location,
            "format": "ubj", "ts": time.time()}


def view_messages(now: float) -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for node, (gpu, load) in NODES.items():
        out.append(("node-features", node, {"node": node, "ts": now, "node_class": "gpu", "gpu_model": gpu,
                                            "window_s": 30.0, "count": 30, "features": {"load__mean": load}}))
        out.append(("node-weights", node, {"node": node, "ts": now, "weight": 1.0, "predicted_rtt_ms": {},
                                           "stale": False}))
    return out


async def publish(settings: Settings, messages: list[tuple[str, str, dict[str, Any]]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    await producer.start()
    try:
        for topic, key, value in messages:
            await producer.send_and_wait(settings.topic(topic), encode(topic, value), key=key.encode())
    finally:
        await producer.stop()


async def wait_ready(client: aiohttp.ClientSession, models: int, timeout_s: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        resp = await client.get("/readyz")
        body = await resp.json(content_type=None)
        if resp.status == 200 and body["models"] >= models:
            return body
        assert time.monotonic() < deadline, f"extender not ready: {body}"
        await asyncio.sleep(0.1)


async def read_predictions(settings: Settings, n: int, timeout_s: float = 20.0) -> list[dict[str, Any]]:
    consumer = AIOKafkaConsumer(settings.topic("rtt-predictions"), bootstrap_servers=settings.bootstrap_servers,
                                auto_offset_reset="earliest", group_id=None)
    await consumer.start()
    out: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(out) < n and time.monotonic() < deadline:
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                out.extend(decode("rtt-predictions", m.value, strict=True) for m in messages)  # what we write
    finally:
        await consumer.stop()
    return out


def args(names: list[str]) -> dict[str, Any]:
    return {"Pod": POD, "Nodes": None, "NodeNames": names}


async def test_extender_learns_the_view_from_kafka_ranks_and_publishes(kafka_settings: Settings,
                                                                       redis_url: str) -> None:
    settings = dataclasses.replace(kafka_settings, redis_url=redis_url)
    update = await asyncio.to_thread(train_and_register, settings)
    now = time.time()
    await publish(settings, [*view_messages(now), ("model-updates", "gCTF:gpu", update)])
    options = dataclasses.replace(ExtenderOptions.from_settings(settings), rebuild_interval_s=0.05)

    service = ExtenderService(settings, options)
    async with running(service, "127.0.0.1", 0) as server, aiohttp.ClientSession(base_url=server.url) as client:
        ready = await wait_ready(client, models=1)
        assert ready["nodes"] == 2
        resp = await client.post("/prioritize", data=orjson.dumps(args(["gpu-slow", "gpu-fast"])))
        scores = {r["Host"]: r["Score"] for r in await resp.json()}
        assert scores["gpu-fast"] == 10 and scores["gpu-slow"] < 5
        predictions = await read_predictions(settings, 2)
        assert {p["node"] for p in predictions} == {"gpu-slow", "gpu-fast"}
        assert {(p["task_id"], p["app"], p["model_key"], p["model_version"]) for p in predictions} == {
            (POD["metadata"]["uid"], "gCTF", "gCTF:gpu", update["version"])}
        by = {p["node"]: p["predicted_rtt_ms"] for p in predictions}
        assert by["gpu-fast"] < by["gpu-slow"]
        assert [p["node"] for p in predictions if p.get("chosen")] == ["gpu-fast"]  # where it assumed the pod

        # a newer node-features message moves the view: the slow node becomes idle and fast
        await publish(settings, [("node-features", "gpu-slow", {
            "node": "gpu-slow", "ts": now + 1, "node_class": "gpu", "gpu_model": "NVIDIA GeForce RTX 4090",
            "window_s": 30.0, "count": 30, "features": {"load__mean": 0.0}})])
        deadline = time.monotonic() + 15
        while True:
            resp = await client.post("/prioritize", data=orjson.dumps(args(["gpu-slow", "gpu-fast"])))
            scores = {r["Host"]: r["Score"] for r in await resp.json()}
            if scores["gpu-slow"] == 10:
                break
            assert time.monotonic() < deadline, scores
            await asyncio.sleep(0.1)

        # how late the view reads each topic: the newest record of a partition per fetch, record time to now
        text = await (await client.get("/metrics")).text()
        delays = {line.split("{")[0].rsplit("_", 1)[-1] + ":" + line.split('topic="')[1].split('"')[0]:
                  float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith("rtt_extender_feed_delay_seconds_") and 'le="' not in line}
        for topic in ("node-features", "node-weights", "model-updates"):
            assert delays[f"count:{topic}"] >= 1, delays
            assert 0.0 <= delays[f"sum:{topic}"] < 60.0 * delays[f"count:{topic}"], delays
        fresh = [line for line in text.splitlines()
                 if line.startswith('rtt_extender_feed_delay_seconds_bucket{le="5.0",topic="node-features"}')]
        assert fresh and float(fresh[0].rsplit(" ", 1)[1]) >= 1, fresh

    # the worker's cache of the latest values (the extender cached the model-updates it installed)
    import redis.asyncio as aioredis

    keys = CacheKeys(settings.topic_prefix)
    client_redis = aioredis.from_url(redis_url)
    try:
        for _, _, value in view_messages(now):
            if "features" in value:
                await store_features(client_redis, keys, value)
            else:
                await store_weights(client_redis, keys, value)
        await client_redis.set(keys.features("broken"), b'{"node": "broken"}')
        cached = await load_view(client_redis, keys)
        assert (len(cached.features), len(cached.weights), len(cached.model_updates), cached.rejected) == (2, 2, 1, 1)
    finally:
        await client_redis.aclose()

    # a restarted extender is ready from Redis once its warm start is over, before any Kafka catch-up
    restarted = ExtenderService(settings, options, publish=False, kafka=False)
    await restarted.start()
    try:
        await asyncio.wait_for(restarted.warmed.wait(), 5)
        deadline = time.monotonic() + 5
        while not restarted.ready:
            assert time.monotonic() < deadline, restarted.readiness()
            await asyncio.sleep(0.01)
        snap = restarted.holder.current
        assert snap is not None and set(snap.nodes) == {"gpu-slow", "gpu-fast"} and set(snap.models) == {"gCTF:gpu"}
        result = orjson.loads(restarted.prioritize(parse_args(orjson.dumps(args(["gpu-slow", "gpu-fast"])))))
        assert {r["Host"]: r["Score"] for r in result}["gpu-fast"] == 10
    finally:
        await restarted.stop()



async def test_a_newer_release_s_fields_reach_the_view_ignored(kafka_settings: Settings) -> None:
    """A rolling upgrade: a newer worker's node-features and node-weights carry a field this extender does not
    know. They are applied (not rejected), the field counted and served on /metrics; a message with an unknown
    field that also breaks its contract is still rejected."""
    UNKNOWN_FIELDS.clear()
    now = time.time()
    weights = {"node": "gpu-a", "ts": now, "weight": 0.42, "predicted_rtt_ms": {"gCTF": 120.0}, "stale": False,
               "zone": "eu-1"}
    features = {"node": "gpu-a", "ts": now, "node_class": "gpu", "gpu_model": "Tesla K20c", "window_s": 30.0,
                "count": 30, "features": {"load__mean": 0.5}, "p99_ms": 180.0}
    broken = {**weights, "node": "gpu-b", "weight": 1.5}  # beyond its range: rejected, the extra field or not
    producer = AIOKafkaProducer(bootstrap_servers=kafka_settings.bootstrap_servers)
    await producer.start()
    try:
        for topic, value in (("node-features", features), ("node-weights", weights), ("node-weights", broken)):
            await producer.send_and_wait(kafka_settings.topic(topic), orjson.dumps(value), key=value["node"].encode())
    finally:
        await producer.stop()
    options = dataclasses.replace(ExtenderOptions.from_settings(kafka_settings), rebuild_interval_s=0.05)
    service = ExtenderService(kafka_settings, options, publish=False, redis=False)
    async with running(service, "127.0.0.1", 0) as server, aiohttp.ClientSession(base_url=server.url) as client:
        deadline = time.monotonic() + 30
        while True:
            snap = service.holder.current
            node = snap.nodes.get("gpu-a") if snap is not None else None
            if node is not None and node.weight is not None and node.features_ts > 0:
                break
            assert time.monotonic() < deadline, service.readiness()
            await asyncio.sleep(0.05)
        assert node.weight == 0.42 and node.weights_ts == now and node.features_ts == now
        assert "gpu-b" not in snap.nodes
        text = await (await client.get("/metrics")).text()
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line and not line.startswith("#")}
    assert samples['rtt_extender_feed_messages_total{result="applied",topic="node-weights"}'] == 1
    assert samples['rtt_extender_feed_messages_total{result="applied",topic="node-features"}'] == 1
    assert samples['rtt_extender_feed_messages_total{result="rejected",topic="node-weights"}'] == 1
    assert samples['rtt_contract_unknown_fields_total{field="zone",topic="node-weights"}'] == 1
    assert samples['rtt_contract_unknown_fields_total{field="p99_ms",topic="node-features"}'] == 1
    UNKNOWN_FIELDS.clear()
