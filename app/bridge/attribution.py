"""Which node a completion belongs to, and which nodes have metrics: the span options of ``rttsched publish``.

A **node map** is a YAML (or JSON) mapping from a pod or host name, as spans carry it in ``k8s.pod.name``,
``host.name`` or Jaeger's ``hostname``, to the node it runs on -- for tracers that cannot add
``k8s.node.name`` (the OpenTelemetry Collector's ``k8sattributes`` processor does)::

    cryoem-runner-7d9f6c5b8-x2k4q: worker-3
    10.0.0.13: worker-3

The **known nodes** are the nodes that have metrics: those of a bridge targets file (the nodes it scrapes)
and those whose node-features the worker keeps in Redis (``rttsched:{prefix}features:{node}``). A completion
on any other node could never join its node's features; it is reported, or dead-lettered, with the reason
``unknown_node``. Without either source nothing is checked (and ``rttsched publish`` says so).

>>> import pathlib, tempfile
>>> p = pathlib.Path(tempfile.mkdtemp()) / "nodes.yaml"
>>> _ = p.write_text("runner-x2k4q: worker-3\\n")
>>> load_node_map(p)
{'runner-x2k4q': 'worker-3'}
>>> _ = p.write_text("- worker-3\\n")
>>> load_node_map(p)
Traceback (most recent call last):
...
app.errors.ConfigError: ...nodes.yaml: must map pod or host names to node names (got a list)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from redis.exceptions import RedisError

from app.config import Settings
from app.errors import ConfigError, read_error
from app.redis_client import DEFAULT_TIMEOUT_S, async_redis_client, password_setting, refused_login
from app.scheduler.cache import CacheKeys

log = logging.getLogger(__name__)


def load_node_map(path: str | Path) -> dict[str, str]:
    """Read a node map file; :class:`ConfigError` naming the file (and the entry) when it is not one."""
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(str(path), f"cannot read node map: {read_error(exc)}") from None
    if not isinstance(doc, dict):
        raise ConfigError(str(path), f"must map pod or host names to node names (got a {type(doc).__name__})")
    out: dict[str, str] = {}
    for name, node in doc.items():
        if not isinstance(node, str) or not node or name is None:
            raise ConfigError(f"{path}: {name}", f"must name a node (got {node!r})")
        out[str(name)] = node
    return out


def nodes_of_targets(targets: Iterable[Any]) -> set[str]:
    """The node names of bridge targets (:class:`~app.bridge.targets.Target`)."""
    return {t.node for t in targets}


async def nodes_with_features(client: Any, keys: CacheKeys) -> set[str]:
    """Nodes whose latest node-features the worker keeps in Redis."""
    out = set()
    async for key in client.scan_iter(match=keys.pattern("features"), count=1000):
        out.add(keys.kind_of(key.decode() if isinstance(key, bytes) else str(key))[1])
    return out


async def known_nodes(redis_url: str, prefix: str, targets: Iterable[Any] = (),
                      timeout_s: float = DEFAULT_TIMEOUT_S, *, settings: Settings | None = None) -> set[str] | None:
    """The nodes that have metrics (targets, Redis, a call failing after ``timeout_s`` without an answer); None
    when there is no source to ask.

    A Redis that cannot be reached is an error naming ``REDIS_URL``: publishing unchecked would hide it. One that
    refuses the password it is given names ``RTT_REDIS_PASSWORD_FILE`` and what gives it the password, set or
    not, when ``settings`` (those ``redis_url`` is the ``redis_client_url`` of) are given.
    """
    nodes = nodes_of_targets(targets)
    if not redis_url:
        return nodes or None

    client = async_redis_client(redis_url, timeout_s)
    try:
        nodes |= await nodes_with_features(client, CacheKeys(prefix))
    except (RedisError, OSError) as exc:
        why = f"cannot read the nodes that have metrics: {exc}"
        if settings is not None and refused_login(exc):
            raise ConfigError("RTT_REDIS_PASSWORD_FILE", f"{why} ({password_setting(settings)})") from None
        raise ConfigError("REDIS_URL", why) from None
    finally:
        await client.aclose()
    return nodes
