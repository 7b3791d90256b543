"""Jaeger query-API JSON (``GET /api/traces``, ``/api/traces/{id}``) -> task-completions.

The query service answers ``{"data": [trace, ...], "total", "limit", "offset", "errors"}``; a trace is
``{traceID, spans: [...], processes: {processID: {serviceName, tags}}}`` (``model/json/model.go`` of
jaegertracing/jaeger). Unlike the Kafka encoding (:mod:`app.bridge.jaeger`), ids are hex strings, times are
integers in **microseconds** (``startTime`` since the epoch, ``duration``), tags are
``{key, type: string|bool|int64|float64|binary, value}``, and a span names its process by ``processID``.
A span is a root when it has no ``CHILD_OF`` reference. Attribute conventions: :mod:`app.bridge.spans`.

>>> doc = {"data": [{"traceID": "3a7c19e4643f5373", "processes": {"p1": {"serviceName": "cryoem",
...     "tags": [{"key": "k8s.node.name", "type": "string", "value": "worker-2"}]}},
...     "spans": [{"traceID": "3a7c19e4643f5373", "spanID": "643f5373d261be13", "operationName": "upload",
...                "startTime": 1796119200000000, "duration": 2500000, "processID": "p1",
...                "tags": [{"key": "rtt.task_id", "type": "string", "value": "up-1"}]}]}]}
>>> [(c["task_id"], c["node"], c["rtt_ms"]) for c in query_response_to_completions(doc).completions]
[('up-1', 'worker-2', 2500.0)]
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from app.bridge.spans import Result, SpanBatch, SpanOptions, completion_from_span, key_values, tagged_error
from app.errors import ContractError

_HEX_ID = re.compile(r"^[0-9a-fA-F]{1,16}$")


def _value(tag: Mapping[str, Any]) -> Any:
    v, kind = tag.get("value"), tag.get("type", "string")
    if kind == "bool":
        return v in (True, "true")
    if kind in ("int64", "float64"):
        try:
            return int(v) if kind == "int64" else float(v)  # type: ignore[arg-type]  # bad types raise below
        except (TypeError, ValueError):
            raise ContractError("bad_span", f"tag {tag.get('key')!r}: {kind} {v!r}") from None
    return v if kind != "binary" else None


def tags(raw: Any) -> dict[str, Any]:
    """Query-API tags as a plain dict (later duplicates win)."""
    return key_values(raw, _value, "tags", "{key, type, value}")


def _micros(span: Mapping[str, Any], key: str) -> float:
    v = span.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ContractError("bad_span", f"{key} must be a non-negative integer of microseconds (got {v!r})")
    return v // 1_000_000 + (v % 1_000_000) / 1e6


def _span(span: Any, processes: Mapping[str, Any], options: SpanOptions | None = None) -> Result | None:
    if not isinstance(span, dict):
        raise ContractError("bad_span", f"a span is a JSON object, got {type(span).__name__}")
    attrs = tags(span.get("tags"))
    process = span.get("process") or processes.get(str(span.get("processID")))
    if not isinstance(process, dict):
        process = {}
    span_id = span.get("spanID")
    if not isinstance(span_id, str) or not _HEX_ID.match(span_id):
        raise ContractError("bad_span", f"spanID must be hex (got {span_id!r})")
    refs = span.get("references") or []
    root = not any(isinstance(r, dict) and r.get("refType", "CHILD_OF") == "CHILD_OF" for r in refs)
    start = _micros(span, "startTime")
    return completion_from_span(
        span_id=span_id.lower().rjust(16, "0"), name=str(span.get("operationName") or ""),
        service=process.get("serviceName"), start_s=start, end_s=start + _micros(span, "duration"), attrs=attrs,
        resource=tags(process.get("tags")), error=tagged_error(attrs), root=root, options=options,
    )


def query_response_to_completions(doc: Any, options: SpanOptions | None = None) -> SpanBatch:
    """A query-API response (or one trace of it) -> completions, skipped count and per-span errors.

    A document that is not a query response raises :class:`ContractError` (``bad_export``).
    """
    traces = doc.get("data") if isinstance(doc, dict) else None
    if isinstance(doc, dict) and "spans" in doc:
        traces = [doc]
    if not isinstance(traces, list):
        raise ContractError("bad_export", "a Jaeger query response has data: [traces]")
    batch = SpanBatch(options or SpanOptions())
    for i, trace in enumerate(traces):
        if not isinstance(trace, dict) or not isinstance(trace.get("spans", []), list):
            raise ContractError("bad_export", f"data[{i}] must be a trace with spans: [...]")
        processes = trace.get("processes") or {}
        if not isinstance(processes, dict):
            raise ContractError("bad_export", f"data[{i}].processes must be an object")
        for span in trace.get("spans", []):
            batch.convert(_span, span, processes)
    return batch
