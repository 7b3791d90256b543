"""Read ``topics/*.json`` into :class:`TopicContract` objects with compiled validators."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastjsonschema
import orjson

from app.errors import ConfigError

TOPIC_NAMES = (
    "node-metrics", "task-completions", "rtt-predictions", "node-features", "training-samples",
    "prediction-errors", "retrain-events", "model-updates", "node-weights", "dead-letters",
)


_PACKAGED_TOPICS = Path(__file__).resolve().parents[2] / "topics"  # resolved once: contract() runs per message


def topics_dir() -> Path:
    """``RTT_TOPICS_DIR`` or the ``topics/`` folder beside the package."""
    env = os.environ.get("RTT_TOPICS_DIR")
    return Path(env) if env else _PACKAGED_TOPICS


@dataclasses.dataclass(frozen=True)
class TopicContract:
    name: str
    description: str
    key: str
    partitions: int
    replication_factor: int
    cleanup_policy: str
    retention_ms: int
    value_schema: dict[str, Any]
    validator: Callable[[Any], Any] = dataclasses.field(repr=False, compare=False)

    @property
    def compacted(self) -> bool:
        return self.cleanup_policy == "compact"

    def topic_configs(self) -> dict[str, str]:
        """Broker-side topic configuration (``cleanup.policy``, ``retention.ms``)."""
        return {"cleanup.policy": self.cleanup_policy, "retention.ms": str(self.retention_ms)}


def _parse(path: Path) -> TopicContract:
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ConfigError(str(path), f"cannot read topic contract: {exc}") from None
    try:
        validator = fastjsonschema.compile(doc["value_schema"])
        return TopicContract(
            name=str(doc["name"]), description=str(doc.get("description", "")), key=str(doc["key"]),
            partitions=int(doc["partitions"]), replication_factor=int(doc.get("replication_factor", 1)),
            cleanup_policy=str(doc["cleanup_policy"]), retention_ms=int(doc["retention_ms"]),
            value_schema=doc["value_schema"], validator=validator,
        )
    except KeyError as exc:
        raise ConfigError(f"{path}.{exc.args[0]}", "required field missing") from None
    except fastjsonschema.JsonSchemaDefinitionException as exc:
        raise ConfigError(f"{path}.value_schema", str(exc)) from None


@functools.lru_cache(maxsize=4)
def _load(directory: str) -> dict[str, TopicContract]:
    out: dict[str, TopicContract] = {}
    for name in TOPIC_NAMES:
        path = Path(directory) / f"{name}.json"
        c = _parse(path)
        if c.name != name:
            raise ConfigError(f"{path}.name", f"must be {name!r} (got {c.name!r})")
        out[name] = c
    return out


def load_contracts(directory: Path | None = None) -> dict[str, TopicContract]:
    """All topic contracts, by topic name.

    >>> sorted(load_contracts())[:3]
    ['dead-letters', 'model-updates', 'node-features']
    >>> load_contracts()["node-features"].compacted
    True
    """
    return _load(str(directory or topics_dir()))


def contract(name: str) -> TopicContract:
    return load_contracts()[name]
