"""Read ``topics/*.json`` into :class:`TopicContract` objects with compiled validators."""

from __future__ import annotations

import copy
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


_NAME_RULE_KEYS = {"minLength", "maxLength", "pattern", "description", "title", "$comment"}
NAMES_REMEMBERED = 16_384  # names each map's rule remembers as valid (beyond: checked each time, nothing grows)


class NameRule:
    """A map's ``propertyNames`` rule, remembering the names it found valid: the maps of one topic carry the same
    few hundred names message after message, and checking each one by the validator's code (a regular expression
    a name) was most of the time a training sample took to validate."""

    def __init__(self, definition: dict[str, Any]) -> None:
        self._check = fastjsonschema.compile(definition)
        self._known: set[str] = set()

    def ok(self, name: str) -> bool:
        """Whether ``name`` follows the rule (checked by the schema's own code, not remembered)."""
        try:
            self._check(name)
        except fastjsonschema.JsonSchemaValueException:
            return False
        return True

    def all_ok(self, m: dict[Any, Any]) -> bool:
        keys = m.keys()
        known = self._known
        if keys <= known:
            return True
        for name in keys:
            if name not in known:
                if not self.ok(name):
                    return False
                if len(known) < NAMES_REMEMBERED:
                    known.add(name)
        return True


class SchemaValidator:
    """The compiled validator of ``schema``, answering as ``fastjsonschema.compile(schema)`` does (the same errors),
    with the names of its top-level maps (a ``propertyNames`` of lengths and a pattern: ``rules``) checked against
    what each map's rule found valid before; a value the faster path refuses is validated by the schema's own code,
    so the error is the schema's."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self._full = fastjsonschema.compile(schema)
        self.rules: dict[str, NameRule] = {}
        for prop, sub in (schema.get("properties") or {}).items():
            names = sub.get("propertyNames") if isinstance(sub, dict) else None
            if isinstance(names, dict) and not set(names) - _NAME_RULE_KEYS and "properties" not in sub:
                self.rules[prop] = NameRule(names)
        stripped = copy.deepcopy(schema)
        for prop in self.rules:
            del stripped["properties"][prop]["propertyNames"]
        self._rest = fastjsonschema.compile(stripped) if self.rules else self._full

    def __call__(self, value: Any) -> Any:
        try:
            out = self._rest(value)
        except fastjsonschema.JsonSchemaValueException:
            self._full(value)  # the schema's own error (what the rest of it refuses, the whole schema refuses)
            raise
        if self.rules and isinstance(value, dict):
            for prop, rule in self.rules.items():
                m = value.get(prop)
                if isinstance(m, dict) and m and not rule.all_ok(m):
                    return self._full(value)  # raises the schema's own error
        return out


def _parse(path: Path) -> TopicContract:
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ConfigError(str(path), f"cannot read topic contract: {exc}") from None
    try:
        validator = SchemaValidator(doc["value_schema"])
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
