"""Fields a contract does not know: ignored on the way in, so a release may add optional fields.

During a rolling upgrade consumers of the previous release read what producers of the new one write. A
field the new release added to a contract is unknown to the old one: :func:`app.contracts.decode` drops it
(:func:`drop_unknown`) and checks the rest against the contract as strictly as ever, so the code that uses
the value never sees the field and a real violation is still refused with its reason. Only objects that
declare their ``properties`` and refuse others (``additionalProperties: false``) have unknown fields: the
keys of a map (``additionalProperties`` a schema: apps, metrics, features) are data, checked as before.

Each field dropped is counted, process-wide, in ``rtt_contract_unknown_fields_total{topic, field}`` (each
process adds the counter to its registry: :func:`register_unknown_fields`) and the first of each
``(topic, field)`` is logged at WARNING. A nested field is named by its path, a map's entries as ``*``
(``apps.*.p99_ms``); names are cut to :data:`MAX_NAME_CHARS` and at most :data:`MAX_NAMES` are remembered,
the others counted as ``field="_other"``.

>>> value = {"node": "n1", "weight": 1.0, "p99_ms": 3.0, "apps": {"gCTF": {"n": 1, "tail": 2}}}
>>> drop_unknown({"type": "object", "additionalProperties": False, "properties": {
...     "node": {}, "weight": {}, "apps": {"type": "object", "additionalProperties": {
...         "type": "object", "properties": {"n": {}}, "additionalProperties": False}}}}, value)
['p99_ms', 'apps.*.tail']
>>> value
{'node': 'n1', 'weight': 1.0, 'apps': {'gCTF': {'n': 1}}}
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric

log = logging.getLogger(__name__)

MAX_NAMES = 200  # distinct (topic, field) pairs remembered (logged once, counted by name) per process
MAX_NAME_CHARS = 64  # a field's name in the log and the metric label
OTHER = "_other"  # the field label of the names beyond MAX_NAMES
METRIC = "rtt_contract_unknown_fields"


def drop_unknown(schema: Mapping[str, Any], value: Any, path: str = "") -> list[str]:
    """Remove from ``value`` (in place) the fields ``schema`` does not declare; their paths, in order.

    Below the top it follows declared properties, map values (``additionalProperties`` a schema) and array
    items; an object with ``patternProperties`` keeps its keys (what they may be is not a plain list).
    """
    dropped: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties", True)
        declared = props if isinstance(props, dict) else {}
        if extra is False and "patternProperties" not in schema:
            for name in [k for k in value if k not in declared]:
                del value[name]
                dropped.append(path + name)
        for name, sub in declared.items():
            if name in value and isinstance(sub, dict):
                dropped += drop_unknown(sub, value[name], f"{path}{name}.")
        if isinstance(extra, dict):
            for name, item in value.items():
                if name not in declared:
                    dropped += drop_unknown(extra, item, f"{path}*.")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            dropped += drop_unknown(schema["items"], item, f"{path}[].")
    return dropped


class UnknownFields:
    """What the consumers of this process dropped: counts per ``(topic, field)``, each pair logged once."""

    def __init__(self, max_names: int = MAX_NAMES) -> None:
        if max_names < 0:
            raise ValueError(f"max_names must be >= 0 (got {max_names})")
        self.max_names = max_names
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}
        self._named = 0  # pairs counted by their own name (the rest: OTHER)

    def note(self, topic: str, fields: Iterable[str]) -> None:
        """Count the fields dropped from one message of ``topic``; log the pairs not seen before."""
        first: list[str] = []
        with self._lock:
            for field in fields:
                key = (topic, field[:MAX_NAME_CHARS])
                if key not in self._counts:
                    if self._named >= self.max_names:
                        key = (topic, OTHER)
                    else:
                        self._named += 1
                    if key not in self._counts:
                        first.append(key[1])
                self._counts[key] = self._counts.get(key, 0) + 1
        for field in first:
            if field == OTHER:
                log.warning("%s: more than %d unknown fields seen: the others are ignored unnamed (field=%r)",
                            topic, self.max_names, OTHER)
            else:
                log.warning("%s: field %r is not in the contract (from a newer release?): ignored, logged once"
                            " (rtt_contract_unknown_fields_total)", topic, field)

    def counts(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)

    def clear(self) -> None:
        with self._lock:
            self._counts.clear()
            self._named = 0


UNKNOWN_FIELDS = UnknownFields()  # this process's: what app.contracts.decode dropped


class _Collector:
    """``rtt_contract_unknown_fields_total{topic, field}`` read from :data:`UNKNOWN_FIELDS` at each scrape."""

    def __init__(self, fields: UnknownFields) -> None:
        self._fields = fields

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(METRIC, "Fields their topic's contract does not declare, dropped from"
                                   " consumed messages (a newer release's producer)", labels=["topic", "field"])

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for (topic, field), n in sorted(self._fields.counts().items()):
            family.add_metric([topic, field], n)
        yield family


_REGISTERED: weakref.WeakSet[CollectorRegistry] = weakref.WeakSet()


def register_unknown_fields(registry: CollectorRegistry) -> None:
    """Serve this process's unknown-field counts on ``registry`` (once per registry, however often asked)."""
    if registry not in _REGISTERED:
        registry.register(_Collector(UNKNOWN_FIELDS))
        _REGISTERED.add(registry)
