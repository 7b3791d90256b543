"""OTLP JSON trace exports (OpenTelemetry Collector Kafka exporter, ``encoding: otlp_json``) -> task-completions.

One Kafka message is one ``ExportTraceServiceRequest``:
``{"resourceSpans": [{"resource": {"attributes": [...]}, "scopeSpans": [{"spans": [...]}]}]}``; a span has
``traceId``/``spanId``/``parentSpanId`` -- hex as OTLP/JSON prescribes, or base64 as protobuf's generic
JSON mapping writes bytes (both are accepted) --, ``name``, ``startTimeUnixNano``/``endTimeUnixNano``
(decimal strings, or numbers),
``attributes: [{key, value: {stringValue | intValue (a string) | doubleValue | boolValue}}]`` and
``status: {code}`` (2 = error). The service name is the resource attribute ``service.name``. Attribute
conventions: :mod:`app.bridge.spans`.

>>> doc = {"resourceSpans": [{"resource": {"attributes": [
...     {"key": "k8s.node.name", "value": {"stringValue": "worker-2"}}]},
...     "scopeSpans": [{"spans": [{"spanId": "00000000000000ab", "name": "upload",
...         "startTimeUnixNano": "1796119200000000000", "endTimeUnixNano": "1796119203000000000",
...         "attributes": [{"key": "rtt.app", "value": {"stringValue": "upload"}}]},
...       {"spanId": "00000000000000ac", "name": "GET /healthz", "startTimeUnixNano": "1", "endTimeUnixNano": "2"}
...     ]}]}]}
>>> b = otlp_to_completions(doc)
>>> [(c["task_id"], c["node"], c["rtt_ms"]) for c in b.completions], b.skipped
([('00000000000000ab', 'worker-2', 3000.0)], 1)
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any

from app.bridge.spans import Result, SpanBatch, SpanOptions, completion_from_span, key_values
from app.errors import ContractError

STATUS_ERROR = 2
_HEX_ID = re.compile(r"^[0-9a-fA-F]{16}$")
_B64_ID = re.compile(r"^[A-Za-z0-9+/_-]{11}=?$")


def span_id_hex(key: str, raw: Any, required: bool = True) -> str:
    """A span id as 16 lower-case hex digits, from hex or from base64 (8 bytes); "" for an absent parent.

    >>> span_id_hex("spanId", "AAAAAAAAAKs="), span_id_hex("spanId", "00000000000000AB")
    ('00000000000000ab', '00000000000000ab')
    """
    if not required and raw in (None, ""):
        return ""
    if isinstance(raw, str) and _HEX_ID.match(raw):
        return raw.lower()
    if isinstance(raw, str) and _B64_ID.match(raw):
        try:
            data = base64.b64decode(raw.replace("-", "+").replace("_", "/").ljust(12, "="), validate=True)
        except (binascii.Error, ValueError):
            data = b""
        if len(data) == 8:
            return data.hex()
    raise ContractError("bad_span", f"{key} must be 16 hex digits or the base64 of 8 bytes (got {raw!r})")


def _any_value(key: str, v: Any) -> Any:
    if not isinstance(v, dict):
        raise ContractError("bad_span", f"attribute {key!r}: value must be an AnyValue object")
    if "stringValue" in v:
        return v["stringValue"]
    if "boolValue" in v:
        return bool(v["boolValue"])
    try:
        if "intValue" in v:
            return int(v["intValue"])
        if "doubleValue" in v:
            return float(v["doubleValue"])
    except (TypeError, ValueError):
        raise ContractError("bad_span", f"attribute {key!r}: bad number {v!r}") from None
    return None  # arrays, maps and bytes carry nothing the conventions read


def attributes(raw: Any) -> dict[str, Any]:
    """OTLP ``attributes`` as a plain dict."""
    return key_values(raw, lambda a: _any_value(a["key"], a.get("value")), "attributes", "{key, value}")


def _nanos(span: Mapping[str, Any], key: str) -> float:
    v = span.get(key)
    try:
        n = int(v) if isinstance(v, str | int) and not isinstance(v, bool) else None
    except ValueError:
        n = None
    if n is None or n < 0:
        raise ContractError("bad_span", f"{key} must be a non-negative integer (got {v!r})")
    return n // 1_000_000_000 + (n % 1_000_000_000) / 1e9


def _is_error(span: Mapping[str, Any], attrs: Mapping[str, Any]) -> bool:
    status = span.get("status") or {}
    code = status.get("code") if isinstance(status, dict) else None
    return code in (STATUS_ERROR, "STATUS_CODE_ERROR") or attrs.get("error") is True


def _span(span: Any, resource: Mapping[str, Any], options: SpanOptions | None = None) -> Result | None:
    if not isinstance(span, dict):
        raise ContractError("bad_span", "a span must be an object")
    attrs = attributes(span.get("attributes"))
    span_id = span_id_hex("spanId", span.get("spanId"))
    parent = span_id_hex("parentSpanId", span.get("parentSpanId"), required=False)
    return completion_from_span(
        span_id=span_id, name=str(span.get("name") or ""), service=resource.get("service.name"),
        start_s=_nanos(span, "startTimeUnixNano"), end_s=_nanos(span, "endTimeUnixNano"), attrs=attrs,
        resource=resource, error=_is_error(span, attrs), root=not parent, options=options,
    )


def _list(doc: Mapping[str, Any], key: str, where: str) -> list[Any]:
    v = doc.get(key, [])
    if not isinstance(v, list):
        raise ContractError("bad_export", f"{where}.{key} must be a list")
    return v


def otlp_to_completions(doc: Any, options: SpanOptions | None = None) -> SpanBatch:
    """One OTLP JSON export -> completions, skipped count and per-span errors.

    A document that is not an export at all raises :class:`ContractError` (``bad_export``).
    """
    if not isinstance(doc, dict):
        raise ContractError("not_an_object", f"an OTLP export is a JSON object, got {type(doc).__name__}")
    other = sorted(set(doc) - {"resourceSpans"})
    if other:  # an export has resourceSpans only (none at all when empty); anything else is another document
        raise ContractError("bad_export", f"an OTLP export has resourceSpans, not {', '.join(other[:5])}")
    batch = SpanBatch(options or SpanOptions())
    for i, rs in enumerate(_list(doc, "resourceSpans", "")):
        if not isinstance(rs, dict):
            raise ContractError("bad_export", f"resourceSpans[{i}] must be an object")
        try:
            resource = attributes((rs.get("resource") or {}).get("attributes"))
        except (ContractError, AttributeError) as exc:
            raise ContractError("bad_export", f"resourceSpans[{i}].resource: {exc}") from None
        scopes = _list(rs, "scopeSpans", f"resourceSpans[{i}]") or _list(rs, "instrumentationLibrarySpans", "")
        for scope in scopes:
            for span in _list(scope, "spans", f"resourceSpans[{i}].scopeSpans") if isinstance(scope, dict) else []:
                batch.convert(_span, span, resource)
    return batch
