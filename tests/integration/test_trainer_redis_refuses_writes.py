"""A Redis that answers but refuses writes — out of memory under ``noeviction``, or demoted to a replica — is the
registry being unavailable for the trainer, as a Redis away is: the retrain waits (degraded ``model_store``), is not
ended as failed, and stores its model once Redis takes writes again. On the real broker and a redis-server of the
test's own (its configuration is changed)."""

from __future__ import annotations

import dataclasses
import uuid

import numpy as np
import pytest
import redis
from fault_stack import RedisServer
from redis_servers import server
from test_trainer import FAST, KEY, event, produce, samples, wait_for

from app.config import Settings
from app.contracts import encode
from app.kafka.embedded import free_port
from app.model.errors import RegistryUnavailableError
from app.registry.redis_store import RedisModelStore
from app.trainer.registry import ModelRegistry
from app.trainer.service import TrainerService

pytestmark = pytest.mark.integration
__all__ = ["server"]  # the fixture, used here


def refuse_writes(client: redis.Redis, how: str) -> None:
    """Make Redis refuse writes: ``oom``, over its ``maxmemory`` under ``noeviction``; ``replica``, following a
    master that is not there (read-only, its data kept)."""
    if how == "oom":  # filled, then a limit well below what it holds: every write is refused
        for i in range(100):
            client.set(f"fill:{i}", b"x" * 10_000)
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", str(int(client.info("memory")["used_memory"]) // 2))
    else:
        client.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
    with pytest.raises(redis.exceptions.ResponseError):
        client.set("probe", b"1")


def take_writes(client: redis.Redis, how: str) -> None:
    if how == "oom":
        client.config_set("maxmemory", "0")
    else:
        client.execute_command("REPLICAOF", "NO", "ONE")


@pytest.mark.parametrize("how", ["oom", "replica"])
def test_the_registry_is_unavailable_while_redis_refuses_writes(server: RedisServer, how: str) -> None:
    store = RedisModelStore(server.url, namespace=f"t{uuid.uuid4().hex[:10]}")
    registry = ModelRegistry(store=store)
    refuse_writes(store.client, how)
    with pytest.raises(RegistryUnavailableError):
        store.save(KEY, b"blob", fmt="ubj", features=["a"], params={}, metrics={}, n_samples=1, replacing=0)
    with pytest.raises(RegistryUnavailableError):  # it answers reads, but would not take the save
        registry.ready(KEY)
    take_writes(store.client, how)
    registry.ready(KEY)
    assert store.save(KEY, b"blob", fmt="ubj", features=["a"], params={}, metrics={}, n_samples=1,
                      replacing=0).version == 1
    store.close()


@pytest.mark.parametrize("how", ["oom", "replica"])
async def test_a_retrain_waits_while_redis_refuses_writes_and_stores_its_model_after(
        kafka_settings: Settings, server: RedisServer, how: str) -> None:
    settings = dataclasses.replace(kafka_settings, redis_url=server.url)
    await produce(settings, "training-samples",
                  [(KEY, encode("training-samples", s)) for s in samples(300, 0, np.random.default_rng(2))])
    store = RedisModelStore(server.url, namespace=f"t{uuid.uuid4().hex[:10]}")
    refuse_writes(store.client, how)
    await produce(settings, "retrain-events", [(KEY, event(KEY, "cold_start"))])
    service = TrainerService(settings, registry=ModelRegistry(store=store), train_params=FAST,
                             catch_up_timeout_s=15.0, registry_check_s=0)
    async with service:
        reg = service.metrics.registry
        await wait_for(lambda: (reg.get_sample_value("rtt_trainer_retrain_retries_total", {"step": "registry"})
                                or 0) >= 1 or bool(service.outcomes), 60.0, "the retrain to reach the registry")
        assert not service.outcomes  # waiting, not failed (a failed retrain's event is committed: its model lost)
        assert reg.get_sample_value("rtt_trainer_degraded", {"reason": "model_store"}) == 1.0
        assert store.current(KEY) is None
        take_writes(store.client, how)
        await wait_for(lambda: bool(service.outcomes), 60.0, "the retrain once Redis takes writes")
        assert [(o.reason, o.outcome, o.version) for o in service.outcomes] == [("cold_start", "promoted", 1)]
        current = store.current(KEY)
        assert current is not None and current.version == 1
        assert reg.get_sample_value("rtt_trainer_degraded", {"reason": "model_store"}) == 0.0
    store.close()
