"""Jaeger spans as its Kafka exporter writes them (``--kafka.producer.encoding=json``) -> task-completions.

That encoding is the protobuf JSON mapping of ``jaeger.api_v2.Span``: ``traceId``/``spanId`` base64,
``startTime`` RFC 3339, ``duration`` a Duration string (``"12.5s"``), ``tags`` as
``[{key, vType?, vStr | vBool | vInt64 (a string) | vFloat64 | vBinary}]`` (``vType`` STRING is the
default and left out), ``references: [{refType?, traceId, spanId}]`` (``refType`` CHILD_OF is the default
and left out), ``process: {serviceName, tags}``. One Kafka message is one span. The query API's JSON
(``/api/traces``) has another shape: :mod:`app.bridge.jaeger_query`. Attribute conventions:
:mod:`app.bridge.spans`.

>>> span = {"spanId": "AAAAAAAAAKs=", "operationName": "gCTF", "startTime": "2026-12-01T10:00:00Z",
...         "duration": "12.5s", "tags": [{"key": "rtt.task_id", "vStr": "t-1"}],
...         "process": {"serviceName": "cryoem", "tags": [{"key": "hostname", "vStr": "worker-1"}]}}
>>> jaeger_span_to_completion(span)["rtt_ms"]
12500.0
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any

from app.bridge.jaeger_query import query_response_to_completions
from app.bridge.spans import (
    Result,
    SpanBatch,
    SpanOptions,
    completion_from_span,
    key_values,
    parse_rfc3339,
    tagged_error,
)
from app.errors import ContractError

_DURATION = re.compile(r"^(-)?(\d+)(?:\.(\d{1,9}))?s$")


def parse_duration(text: Any) -> float:
    """Seconds of a protobuf Duration string.

    >>> parse_duration("1.000340s"), parse_duration("3s")
    (1.00034, 3.0)
    """
    m = _DURATION.match(text) if isinstance(text, str) else None
    if not m:
        raise ContractError("bad_span", f"not a Duration string: {text!r}")
    sign, whole, frac = m.groups()
    seconds = int(whole) + (int(frac.ljust(9, "0")) / 1e9 if frac else 0.0)
    return -seconds if sign else seconds


def _tag_value(tag: Mapping[str, Any]) -> Any:
    if "vStr" in tag:
        return tag["vStr"]
    if "vBool" in tag:
        return bool(tag["vBool"])
    if "vInt64" in tag:
        try:
            return int(tag["vInt64"])
        except (TypeError, ValueError):
            raise ContractError("bad_span", f"tag {tag.get('key')!r}: vInt64 {tag['vInt64']!r}") from None
    for key in ("vFloat64", "vDouble"):
        if key in tag:
            try:
                return float(tag[key])
            except (TypeError, ValueError):
                raise ContractError("bad_span", f"tag {tag.get('key')!r}: {key} {tag[key]!r}") from None
    if tag.get("vType", "STRING") == "STRING":
        return ""  # the empty string is the protobuf default, left out of the JSON
    return None


def tags(raw: Any) -> dict[str, Any]:
    """Jaeger tags as a plain dict (later duplicates win)."""
    return key_values(raw, _tag_value, "tags", "{key, v...}")


def _span_id_hex(raw: Any) -> str:
    if not isinstance(raw, str):
        raise ContractError("bad_span", "spanId missing")
    try:
        return base64.b64decode(raw, validate=True).hex()
    except (binascii.Error, ValueError):
        raise ContractError("bad_span", f"spanId is not base64: {raw!r}") from None


def _is_root(references: Any, child_of: tuple[Any, ...]) -> bool:
    if not isinstance(references, list):
        return not references
    return not any(isinstance(r, dict) and r.get("refType") in child_of for r in references)


def jaeger_span_to_completion(span: Any, options: SpanOptions | None = None) -> dict[str, Any] | None:
    """The task-completion of one Jaeger JSON span; None when it is not a task."""
    r = _span(span, options)
    return r[0] if r else None


def _span(span: Any, options: SpanOptions | None = None) -> Result | None:
    if not isinstance(span, dict):
        raise ContractError("not_an_object", f"a Jaeger span is a JSON object, got {type(span).__name__}")
    attrs = tags(span.get("tags"))
    process = span.get("process") or {}
    if not isinstance(process, dict):
        raise ContractError("bad_span", "process must be an object")
    resource = tags(process.get("tags"))
    start = parse_rfc3339(span.get("startTime"))
    duration = parse_duration(span.get("duration", "0s"))
    return completion_from_span(
        span_id=_span_id_hex(span.get("spanId")), name=str(span.get("operationName") or ""),
        service=process.get("serviceName"), start_s=start, end_s=start + duration, attrs=attrs, resource=resource,
        error=tagged_error(attrs), root=_is_root(span.get("references"), (None, "CHILD_OF", 0)), options=options,
    )


def jaeger_to_completions(doc: Any, options: SpanOptions | None = None) -> SpanBatch:
    """One Jaeger message (a span), a list of spans, or a query-API response -> completions, skips, errors."""
    if isinstance(doc, dict) and "data" in doc:
        return query_response_to_completions(doc, options)
    batch = SpanBatch(options or SpanOptions())
    for span in doc if isinstance(doc, list) else [doc]:
        batch.convert(_span, span)
    return batch
