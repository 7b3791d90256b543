"""Redis layout of the latest view, so a restarted extender is ready in well under a second.

The worker writes the latest value of each node as it emits it; the extender writes the model-updates it
applied; anyone who knows what runs where may write the running-apps view. Values are JSON (orjson), the
first three exactly the topic message values (checked against ``topics/`` when read, as a consumer reads them:
fields a newer release added are ignored, :mod:`app.contracts.unknown`)::

    rttsched:{prefix}features:{node}          node-features value          (worker)
    rttsched:{prefix}weights:{node}           node-weights value           (worker)
    rttsched:{prefix}model-updates:{key}      model-updates value          (extender, trainer)
    rttsched:{prefix}running:{node}           {"apps": {app: count}, "started": {app: count}, "ts": unix seconds}
    rttsched:{prefix}running-sync             {"ts": unix seconds}         (pods watcher)

A running-apps value's ``ts`` is when its writer last confirmed it (:mod:`app.extender.podwatch` renews every
value every ``RTT_PODS_RESYNC_S``); ``running-sync`` is when the pods watcher last confirmed the whole view,
written with every list and renewal, also when no node has a value. Both are the writer's clock: a reader
compares them only with each other. :func:`load_running_view` returns them with the counts; the heartbeat
matches no ``running:*`` scan, so it is never read as a node.

``{prefix}`` is ``Settings.topic_prefix``, so deployments (and tests) sharing a Redis never mix views.
Helpers take any client with the ``redis.asyncio.Redis`` methods ``set``, ``mget`` and ``scan_iter``.

>>> keys = CacheKeys("t1-")
>>> keys.features("gpu-1"), keys.model_update("gCTF:gpu")
('rttsched:t1-features:gpu-1', 'rttsched:t1-model-updates:gCTF:gpu')
>>> keys.kind_of(keys.weights("gpu-1"))
('weights', 'gpu-1')
>>> keys.running_sync(), keys.pattern("running")
('rttsched:t1-running-sync', 'rttsched:t1-running:*')
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import Any, Protocol

import orjson

from app.contracts.codec import decode
from app.errors import ContractError

log = logging.getLogger(__name__)

ROOT = "rttsched"
KINDS = {"features": "node-features", "weights": "node-weights", "model-updates": "model-updates", "running": ""}


class AsyncRedis(Protocol):  # the subset of redis.asyncio.Redis used here
    async def set(self, name: str, value: bytes) -> Any: ...
    async def mget(self, keys: list[str]) -> list[bytes | None]: ...
    def scan_iter(self, match: str, count: int) -> Any: ...


@dataclasses.dataclass(frozen=True)
class CacheKeys:
    """Key names under one namespace (``Settings.topic_prefix``)."""

    prefix: str = ""

    def _key(self, kind: str, name: str) -> str:
        return f"{ROOT}:{self.prefix}{kind}:{name}"

    def features(self, node: str) -> str:
        return self._key("features", node)

    def weights(self, node: str) -> str:
        return self._key("weights", node)

    def model_update(self, model_key: str) -> str:
        return self._key("model-updates", model_key)

    def running(self, node: str) -> str:
        return self._key("running", node)

    def running_sync(self) -> str:
        """The pods watcher's heartbeat: outside every kind's pattern, and not a key :meth:`kind_of` parses."""
        return f"{ROOT}:{self.prefix}running-sync"

    def pattern(self, kind: str) -> str:
        return self._key(kind, "*")

    def kind_of(self, key: str) -> tuple[str, str]:
        """(kind, name) of a key of this namespace; ValueError otherwise."""
        head = f"{ROOT}:{self.prefix}"
        if key.startswith(head):
            kind, sep, name = key[len(head):].partition(":")
            if sep and kind in KINDS:
                return kind, name
        raise ValueError(f"{key!r} is not a {head}* cache key")


@dataclasses.dataclass
class CachedView:
    features: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    weights: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    model_updates: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    running: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    running_ts: dict[str, float] = dataclasses.field(default_factory=dict)  # node -> its value's ts, when it has one
    running_sync: float | None = None  # the pods watcher's last confirmation of the whole view (None: no heartbeat)
    rejected: int = 0  # values that did not satisfy their contract

    def __len__(self) -> int:
        return len(self.features) + len(self.weights) + len(self.model_updates) + len(self.running)


def encode_running(apps: Mapping[str, int], ts: float) -> bytes:
    return orjson.dumps({"apps": {str(a): int(c) for a, c in apps.items()}, "ts": float(ts)})


def encode_running_sync(ts: float) -> bytes:
    return orjson.dumps({"ts": float(ts)})


def decode_running_sync(raw: bytes | None) -> float | None:
    """The ``ts`` of a heartbeat value; None when there is none, or it is not one.

    >>> decode_running_sync(encode_running_sync(1700000000.5)), decode_running_sync(b'{"ts": null}')
    (1700000000.5, None)
    """
    if raw is None:
        return None
    try:
        ts = orjson.loads(raw).get("ts")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        return None
    return float(ts)


def decode_running(raw: bytes, started: bool = False) -> dict[str, int]:
    """The ``apps`` map of a running-apps value (``started``: its ``started`` map, the pods running and not
    terminating — ``apps`` for a value of a watcher that wrote none); ContractError when it is not one.

    >>> decode_running(b'{"apps": {"gCTF": 2}, "started": {"gCTF": 1}}', started=True)
    {'gCTF': 1}
    >>> decode_running(b'{"apps": {"gCTF": 1}, "ts": 1.0}', started=True)
    {'gCTF': 1}
    """
    return decode_running_value(raw, started)[0]


def decode_running_value(raw: bytes, started: bool = False) -> tuple[dict[str, int], float | None]:
    """:func:`decode_running` and the value's ``ts`` (None when it has none, or not a number).

    >>> decode_running_value(b'{"apps": {"gCTF": 2}, "ts": 1700000000.5}')
    ({'gCTF': 2}, 1700000000.5)
    >>> decode_running_value(b'{"apps": {}, "ts": "yesterday"}')
    ({}, None)
    """
    try:
        doc = orjson.loads(raw)
        counts = doc["started"] if started and "started" in doc else doc["apps"]
        apps = {str(a): int(c) for a, c in counts.items()}
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ContractError("bad_running_apps", str(exc)) from None
    ts = doc.get("ts")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        return apps, None
    return apps, float(ts)


async def store_features(client: AsyncRedis, keys: CacheKeys, value: Mapping[str, Any]) -> None:
    await client.set(keys.features(value["node"]), orjson.dumps(value))


async def store_weights(client: AsyncRedis, keys: CacheKeys, value: Mapping[str, Any]) -> None:
    await client.set(keys.weights(value["node"]), orjson.dumps(value))


async def store_model_update(client: AsyncRedis, keys: CacheKeys, value: Mapping[str, Any]) -> None:
    await client.set(keys.model_update(value["model_key"]), orjson.dumps(value))


async def store_running(client: AsyncRedis, keys: CacheKeys, node: str, apps: Mapping[str, int], ts: float) -> None:
    await client.set(keys.running(node), encode_running(apps, ts))


async def _scan(client: AsyncRedis, pattern: str) -> list[str]:
    out = []
    async for key in client.scan_iter(match=pattern, count=1000):
        out.append(key.decode() if isinstance(key, bytes) else str(key))
    return out


async def load_running(client: AsyncRedis, keys: CacheKeys, batch: int = 500,
                       started: bool = False) -> dict[str, dict[str, int]]:
    """The running-apps view of every node that has one (``started``: the started pods, :func:`decode_running`)."""
    view = CachedView()
    await _load_kind(client, keys, "running", view, batch, started)
    return view.running


async def load_running_view(client: AsyncRedis, keys: CacheKeys, batch: int = 500) -> CachedView:
    """The running-apps view of every node that has one (``running``) with each value's ``ts`` (``running_ts``:
    when its writer last confirmed it; a value without one is absent there) and the pods watcher's heartbeat
    (``running_sync``: when it last confirmed the whole view; None without one, e.g. from an older watcher)."""
    view = CachedView()
    (raw,) = await client.mget([keys.running_sync()])
    view.running_sync = decode_running_sync(raw)
    await _load_kind(client, keys, "running", view, batch)
    return view


async def load_view(client: AsyncRedis, keys: CacheKeys, batch: int = 500) -> CachedView:
    """Everything cached under ``keys``; values that fail their contract are skipped (and counted), fields their
    contract does not know (a newer writer's) dropped."""
    view = CachedView()
    for kind in KINDS:
        await _load_kind(client, keys, kind, view, batch)
    return view


async def _load_kind(client: AsyncRedis, keys: CacheKeys, kind: str, view: CachedView, batch: int,
                     started: bool = False) -> None:
    names = await _scan(client, keys.pattern(kind))
    for start in range(0, len(names), batch):
        chunk = names[start:start + batch]
        for key, raw in zip(chunk, await client.mget(chunk), strict=True):
            if raw is None:
                continue
            try:
                if kind == "running":
                    node = keys.kind_of(key)[1]
                    view.running[node], ts = decode_running_value(raw, started)
                    if ts is not None:
                        view.running_ts[node] = ts
                else:
                    getattr(view, kind.replace("-", "_")).append(decode(KINDS[kind], raw))
            except ContractError as exc:
                view.rejected += 1
                log.warning("cached %s is not valid (%s), skipped", key, exc.reason)
