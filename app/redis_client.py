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
from app.masking import mask_url, url_password
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


def refused_login(exc: BaseException) -> bool:
    """Whether ``exc``, or what it was raised from, is Redis refusing the client's password (NOAUTH, WRONGPASS, a
    password given to a Redis that asks for none): the password is what to change, not the URL.

    >>> refused_login(redis.AuthenticationError("invalid username-password pair or user is disabled."))
    True
    >>> refused_login(redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."))
    False
    """
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:  # the cause of a wrapper (the model registry's error), and so on
        if isinstance(at, redis.AuthenticationError):
            return True
        seen.add(id(at))
        at = at.__cause__ or at.__context__
    return False


def password_setting(settings: Settings) -> str:
    """What gives Redis its password in ``settings``, for an error about a password Redis refused.

    >>> password_setting(Settings.from_env({"REDIS_URL": "redis://127.0.0.1:6379/0"}))
    'RTT_REDIS_PASSWORD_FILE is not set and REDIS_URL has no password: this Redis asks for one'
    >>> password_setting(Settings.from_env({"REDIS_URL": "redis://:pw@127.0.0.1:6379/0"}))
    'RTT_REDIS_PASSWORD_FILE is not set: Redis refused the password in REDIS_URL'
    """
    if settings.redis_password_file:
        return f"RTT_REDIS_PASSWORD_FILE is set ({settings.redis_password_file}): Redis refused the password in it"
    if url_password(settings.redis_url):
        return "RTT_REDIS_PASSWORD_FILE is not set: Redis refused the password in REDIS_URL"
    return "RTT_REDIS_PASSWORD_FILE is not set and REDIS_URL has no password: this Redis asks for one"


async def check_redis(settings: Settings) -> None:
    """Raise :class:`~app.errors.ConfigError` unless ``settings``' Redis answers a PING with the password it is
    given (a run that needs Redis from its first step says so in one line; the services go on without it and
    retry): naming ``REDIS_URL``, or ``RTT_REDIS_PASSWORD_FILE`` (set or not) when Redis refused the password."""
    client = settings_redis(settings)
    try:
        await client.ping()
    except redis.RedisError as exc:  # refused, timed out, NOAUTH / WRONGPASS
        where = f"cannot use Redis at {mask_url(settings.redis_url)}: {exc}"
        if refused_login(exc):
            raise ConfigError("RTT_REDIS_PASSWORD_FILE", f"{where} ({password_setting(settings)})") from None
        raise ConfigError("REDIS_URL", where) from None
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
