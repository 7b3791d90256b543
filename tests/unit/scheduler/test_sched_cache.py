"""Redis key layout (pure part; the round trip against a real redis is in the integration tests)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from fnmatch import fnmatchcase

import orjson
import pytest

from app.contracts.unknown import UNKNOWN_FIELDS
from app.errors import ContractError
from app.scheduler.cache import CacheKeys, decode_running, encode_running, load_view, store_features, store_weights


def test_key_layout_is_namespaced_and_parseable() -> None:
    k = CacheKeys("t1-")
    assert k.features("n1") == "rttsched:t1-features:n1"
    assert k.weights("n1") == "rttsched:t1-weights:n1"
    assert k.running("n1") == "rttsched:t1-running:n1"
    assert k.model_update("gCTF:gpu:n1") == "rttsched:t1-model-updates:gCTF:gpu:n1"
    assert k.pattern("features") == "rttsched:t1-features:*"
    assert k.kind_of(k.model_update("gCTF:gpu:n1")) == ("model-updates", "gCTF:gpu:n1")
    with pytest.raises(ValueError):
        CacheKeys("t2-").kind_of(k.features("n1"))
    assert CacheKeys().features("n1") == "rttsched:features:n1"


def test_running_apps_round_trip_and_rejects() -> None:
    assert decode_running(encode_running({"gCTF": 2}, ts=5.0)) == {"gCTF": 2}
    for raw in (b"nope", b"{}", b'{"apps": [1]}', b'{"apps": {"a": "x"}}'):
        with pytest.raises(ContractError):
            decode_running(raw)


class DictRedis:
    """The subset of ``redis.asyncio.Redis`` the cache uses, on a dict."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    async def set(self, name: str, value: bytes) -> None:
        self.data[name] = value

    async def mget(self, keys: list[str]) -> list[bytes | None]:
        return [self.data.get(k) for k in keys]

    async def scan_iter(self, match: str, count: int) -> AsyncIterator[str]:
        for key in list(self.data):
            if fnmatchcase(key, match):
                yield key


def test_a_value_cached_by_a_newer_release_loads_without_the_fields_it_added() -> None:
    """An extender of the previous release starting from Redis during a rolling upgrade: the node-weights and
    node-features a newer worker cached carry a field this release does not know; they load, without it."""
    UNKNOWN_FIELDS.clear()
    keys, client = CacheKeys("t1-"), DictRedis()
    weights = {"node": "n1", "ts": 1.0, "weight": 0.5, "predicted_rtt_ms": {"gCTF": 5.0}, "stale": False}
    features = {"node": "n1", "ts": 1.0, "node_class": "gpu", "window_s": 30.0, "count": 3, "features": {"a": 1.0}}

    async def run() -> None:
        await store_weights(client, keys, {**weights, "zone": "eu-1"})
        await store_features(client, keys, {**features, "p99_ms": 3.0})
        await client.set(keys.weights("n2"), orjson.dumps({**weights, "node": "n2", "weight": 2.0, "zone": "x"}))
        view = await load_view(client, keys)
        assert (view.weights, view.features, view.rejected) == ([weights], [features], 1)  # n2: weight > 1

    asyncio.run(run())
    assert UNKNOWN_FIELDS.counts() == {("node-weights", "zone"): 1, ("node-features", "p99_ms"): 1}
    UNKNOWN_FIELDS.clear()
