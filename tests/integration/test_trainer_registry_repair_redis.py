"""The trainer keeping a real Redis registry right, on the real broker: a save whose EXEC reply is lost (a proxy
drops it) is the trainer's own promotion; one key's unreadable record does not stop the registry check from
replacing another key's lost current version, nor a current version whose blob is gone; Redis away still ends the
check."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import select
import socket
import threading
import time
import uuid
from typing import Any

import numpy as np
import pytest
import redis
from aiokafka import AIOKafkaConsumer
from fault_stack import RedisServer
from redis_servers import server
from test_trainer import FAST, KEY, drain, event, produce, samples, updates, wait_for

from app.config import Settings
from app.contracts import encode
from app.model.errors import RegistryUnavailableError
from app.registry.redis_store import RedisModelStore
from app.trainer.agreement import UNREADABLE
from app.trainer.registry import ModelRegistry
from app.trainer.service import TrainerService

pytestmark = pytest.mark.integration
__all__ = ["server", "updates"]  # the fixtures, used here


class LostReplyProxy:
    """A TCP proxy in front of a redis-server. Armed, it forwards the next transaction that sets a model blob (a
    save: ``SET …:blob:…`` then ``EXEC``), swallows Redis's reply and closes that client connection: the save is
    applied, its answer lost (a connection reset, a failover at the wrong moment). One shot."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        self.armed = threading.Event()
        self.fired = threading.Event()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.closed = True
        self.listener.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.port))
            threading.Thread(target=self._pipe, args=(client, server), daemon=True).start()

    def _pipe(self, client: socket.socket, server: socket.socket) -> None:
        saving = False  # this connection has sent a blob's SET since its last EXEC
        try:
            while not self.closed:
                ready, _, _ = select.select([client, server], [], [], 0.2)
                for sock in ready:
                    data = sock.recv(1 << 16)
                    if not data:
                        return
                    if sock is server:
                        client.sendall(data)
                        continue
                    saving = saving or (b":blob:" in data and b"SET" in data)
                    if saving and b"EXEC" in data and self.armed.is_set():
                        self.armed.clear()
                        server.sendall(data)
                        server.settimeout(5.0)
                        server.recv(1 << 16)  # Redis applied it and answered: the answer goes nowhere
                        self.fired.set()
                        return
                    if b"EXEC" in data:
                        saving = False
                    server.sendall(data)
        except OSError:
            return
        finally:
            client.close()
            server.close()


def value(service: TrainerService, name: str, labels: dict[str, str] | None = None) -> float:
    return service.metrics.registry.get_sample_value(name, labels or {}) or 0.0


def app_samples(key: str, n: int, seed: int) -> list[tuple[str, bytes]]:
    app = key.split(":")[0]
    return [(key, encode("training-samples", {**s, "model_key": key, "app": app}))
            for s in samples(n, 0, np.random.default_rng(seed))]


async def test_a_save_whose_reply_is_lost_is_the_trainer_s_own_promotion(
        kafka_settings: Settings, redis_url: str, updates: AIOKafkaConsumer,
        caplog: pytest.LogCaptureFixture) -> None:
    """The proxy forwards the save's MULTI/EXEC and drops its reply: redis-py's retry and the store's WATCH loop
    find the key's current version changed to v1 — the challenger itself. Promoted, announced at once (no registry
    check runs), counted as promoted, with its drift-to-promotion time."""
    caplog.set_level(logging.INFO)
    raw = redis.Redis.from_url(redis_url)
    proxy = LostReplyProxy(int(raw.connection_pool.connection_kwargs["port"]))
    settings = dataclasses.replace(kafka_settings, redis_url=proxy.url)
    ns = f"t{uuid.uuid4().hex[:10]}"
    store = RedisModelStore(proxy.url, namespace=ns)
    await produce(settings, "training-samples", app_samples(KEY, 500, 2))
    service = TrainerService(settings, registry=ModelRegistry(store=store), train_params=FAST, selector=None,
                             catch_up_timeout_s=15.0, registry_check_s=0)
    try:
        async with service:
            proxy.armed.set()
            await produce(settings, "retrain-events", [(KEY, event(KEY, "cold_start"))])
            await wait_for(lambda: bool(service.outcomes), 60.0, "the retrain")
            got = await drain(updates, 10.0)
    finally:
        proxy.close()
        store.close()
    assert proxy.fired.is_set(), "the proxy saw no save"
    assert [(o.outcome, o.version) for o in service.outcomes] == [("promoted", 1)]
    assert [m["version"] for m in got] == [1]
    assert raw.get(f"{ns}:model:{KEY}:current") == b"1"
    assert got[0]["sha256"] == RedisModelStore(redis_url, namespace=ns).current(KEY).sha256  # type: ignore[union-attr]
    assert value(service, "rtt_trainer_retrains_total", {"reason": "cold_start", "outcome": "promoted"}) == 1.0
    assert value(service, "rtt_trainer_retrains_total", {"reason": "cold_start", "outcome": "rejected"}) == 0.0
    assert value(service, "rtt_trainer_drift_to_promotion_seconds_count") == 1.0
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [m for m in said if "judging it again" in m or "rejected" in m], said
    assert [m for m in said if f"retrain of {KEY}: the challenger is current already, as v1" in m], said
    raw.close()


async def test_the_registry_check_repairs_every_key_it_can_read(
        kafka_settings: Settings, redis_url: str, updates: AIOKafkaConsumer,
        caplog: pytest.LogCaptureFixture) -> None:
    """appa:gpu's current metadata is not JSON, zzz:gpu lost its current pointer, gone:gpu its current blob: the
    checks replace zzz:gpu's and gone:gpu's models (v2 each, announced) and name appa:gpu once, degraded
    ``registry_unreadable`` until it is repaired."""
    caplog.set_level(logging.INFO)
    settings = dataclasses.replace(kafka_settings, redis_url=redis_url)
    ns = f"t{uuid.uuid4().hex[:10]}"
    store = RedisModelStore(redis_url, namespace=ns)
    raw = redis.Redis.from_url(redis_url)
    keys = ("appa:gpu", "gone:gpu", "zzz:gpu")
    for i, key in enumerate(keys):
        await produce(settings, "training-samples", app_samples(key, 300, i))
    await produce(settings, "retrain-events", [(key, event(key, "cold_start")) for key in keys])
    service = TrainerService(settings, registry=ModelRegistry(store=store), train_params=FAST, selector=None,
                             catch_up_timeout_s=15.0, registry_check_s=0.3)
    announced: list[tuple[str, int]] = []

    async def read(n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(announced) < n and time.monotonic() < deadline:
            announced.extend((m["model_key"], m["version"]) for m in await drain(updates, 1.0))

    async with service:
        await read(3, 60.0)
        assert sorted(announced) == [(k, 1) for k in keys]
        meta = f"{ns}:model:appa:gpu:meta:1"
        good = raw.get(meta)
        assert isinstance(good, bytes)
        raw.set(meta, b'{"garbage')
        raw.delete(f"{ns}:model:zzz:gpu:current")
        raw.delete(f"{ns}:model:gone:gpu:blob:1")
        await read(5, 60.0)
        assert sorted(announced[3:]) == [("gone:gpu", 2), ("zzz:gpu", 2)]
        for key in ("gone:gpu", "zzz:gpu"):
            assert store.load(key)[1].version == 2  # the model loads
        await asyncio.sleep(1.0)  # three checks more
        assert value(service, "rtt_trainer_degraded", {"reason": UNREADABLE}) == 1.0
        raw.set(meta, good)
        await wait_for(lambda: value(service, "rtt_trainer_degraded", {"reason": UNREADABLE}) == 0.0, 10.0,
                       "the repaired record to be read")
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    about_a = [m for m in said if "appa:gpu" in m]
    assert len(about_a) == 1 and "cannot be checked" in about_a[0] and meta in about_a[0], about_a
    assert not [m for m in said if "registry check failed" in m]
    assert [m for m in said if "gone:gpu" in m and "its blob is gone" in m]
    assert "registry check: model appa:gpu can be checked again" in [r.getMessage() for r in caplog.records]
    lost = sorted((o.model_key, o.outcome, o.version) for o in service.outcomes if o.reason == "registry")
    assert lost == [("gone:gpu", "promoted", 2), ("zzz:gpu", "promoted", 2)]
    store.close()
    raw.close()


async def test_redis_away_still_ends_the_check_with_no_line_per_key(
        settings_factory: Any, server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    ns = f"t{uuid.uuid4().hex[:10]}"
    store = RedisModelStore(server.url, namespace=ns, timeout_s=1.0)
    service = TrainerService(settings_factory(redis_url=server.url), registry=ModelRegistry(store=store),
                             registry_check_s=0)
    for key in ("appa:gpu", "zzz:gpu"):
        record = store.save(key, b"model", fmt="json", features=["a"], params={}, metrics={}, n_samples=1,
                            replacing=0)
        service._note_announced({"model_key": key, "version": record.version, "sha256": record.sha256})

    class AtTheEnd:
        async def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
            return {}

    service._updates = AtTheEnd()  # type: ignore[assignment]
    assert await service.check_registry() == []
    server.stop()
    with pytest.raises(RegistryUnavailableError):
        await service.check_registry()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and said[0].startswith("registry check: model registry at redis://"), said  # not per key
    assert "appa:gpu" not in said[0] and "zzz:gpu" not in said[0]
    assert value(service, "rtt_trainer_degraded", {"reason": UNREADABLE}) == 0.0
    assert value(service, "rtt_trainer_degraded", {"reason": "model_store"}) == 1.0
    store.close()
