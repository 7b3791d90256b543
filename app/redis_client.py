"""Every Redis client rttsched builds, with explicit socket and connect timeouts.

A Redis that accepts connections but never answers (stopped with SIGSTOP, a host whose network went away
mid-connection, a proxy in front of a dead server) must fail a call, not hang it: the worker's model-updates
task, the trainer's executor, the extender's running-pods refresher and model loads would otherwise wait
forever. redis-py's default timeout is none before 8.0 (and 5 s from 8.0 on); the clients here never rely
on it: both timeouts are ``RTT_REDIS_TIMEOUT_S`` (default 5 s). A call to a frozen Redis fails after about
that long with ``redis.TimeoutError`` (a ``RedisError``), which every caller already handles as Redis being away.

>>> client = redis_client("redis://127.0.0.1:6379/0", 2.5)
>>> kw = client.connection_pool.connection_kwargs
>>> kw["socket_timeout"], kw["socket_connect_timeout"]
(2.5, 2.5)
>>> client.close()
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis

from app.config import Settings
from app.errors import ConfigError
from app.masking import mask_url
from app.scheduler.cache import ROOT

DEFAULT_TIMEOUT_S = 5.0  # RTT_REDIS_TIMEOUT_S's default (seconds)


def _checked(timeout_s: float) -> float:
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 (got {timeout_s})")
    return timeout_s


def redis_client(url: str, timeout_s: float, **kwargs: Any) -> redis.Redis:
    """A blocking client of ``url`` whose calls fail after ``timeout_s`` without an answer."""
    timeout_s = _checked(timeout_s)
    return redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, **kwargs)


def async_redis_client(url: str, timeout_s: float, **kwargs: Any) -> aioredis.Redis:
    """An asyncio client of ``url`` whose calls fail after ``timeout_s`` without an answer."""
    timeout_s = _checked(timeout_s)
    return aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, **kwargs)


def settings_redis(settings: Settings) -> aioredis.Redis:
    """The asyncio client of ``settings``' Redis (``REDIS_URL`` with its password, ``RTT_REDIS_TIMEOUT_S``)."""
    return async_redis_client(settings.redis_client_url, settings.redis_timeout_s)


async def check_redis(settings: Settings) -> None:
    """Raise :class:`~app.errors.ConfigError` naming ``REDIS_URL`` unless ``settings``' Redis answers a PING with
    the password it is given (a run that needs Redis from its first step says so in one line; the services go on
    without it and retry)."""
    client = settings_redis(settings)
    try:
        await client.ping()
    except redis.RedisError as exc:  # refused, timed out, NOAUTH / WRONGPASS
        raise ConfigError("REDIS_URL", f"cannot use Redis at {mask_url(settings.redis_url)}: {exc}") from None
    finally:
        await client.aclose()


async def delete_prefixed_keys(settings: Settings) -> int:
    """Delete every key rttsched keeps under ``settings.topic_prefix`` (``rttsched:{prefix}*``: models, the
    scheduler cache, dead-letter marks); how many. An empty prefix deletes nothing."""
    if not settings.topic_prefix:
        return 0
    client = settings_redis(settings)
    try:
        keys = [k async for k in client.scan_iter(match=f"{ROOT}:{settings.topic_prefix}*", count=1000)]
        for i in range(0, len(keys), 1000):
            await client.delete(*keys[i:i + 1000])
        return len(keys)
    finally:
        await client.aclose()
