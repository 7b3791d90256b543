"""Tracing spans -> task-completions: the attribute conventions shared by the Jaeger and OTLP converters.

A span is a **task** when it carries ``rtt.task_id`` or ``rtt.app`` among its own attributes (tags); every
other span is skipped and counted. For a task span:

============== ===================================================================================
field          taken from (first that is present)
============== ===================================================================================
task_id        ``rtt.task_id``; the span id (hex)
app            ``rtt.app``; the span name (operation name); the service name
node           ``k8s.node.name`` on the span, then on the resource (Jaeger: process tags);
               ``host.name``, then Jaeger's process tag ``hostname``
submitted_ts   ``rtt.submitted_ts`` (unix seconds, or an RFC 3339 string); the span's start
started_ts     the span's start
finished_ts    the span's end (start + duration)
rtt_ms         (finished_ts - submitted_ts) * 1000: the response time the user saw, queueing included
status         ``rtt.status`` (ok | failed | cancelled); ``failed`` when the span is an error (Jaeger tag
               ``error=true``, ``otel.status_code=ERROR``, OTLP status code 2); else ``ok``
input_size_mb  ``rtt.input_size_mb`` when present
============== ===================================================================================

A task span that lacks what a completion needs (no node, bad times, end before start) raises
:class:`~app.errors.ContractError`; so does a result that breaks the task-completions contract.

>>> completion_from_span(span_id="00000000000000ab", name="gCTF", service="cryoem", start_s=100.0, end_s=112.5,
...                      attrs={"rtt.task_id": "t-1", "k8s.node.name": "worker-1"}, resource={}, error=False)
{'task_id': 't-1', 'app': 'gCTF', 'node': 'worker-1', 'submitted_ts': 100.0, 'started_ts': 100.0, \
'finished_ts': 112.5, 'rtt_ms': 12500.0, 'status': 'ok'}
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from app.contracts.codec import validate
from app.errors import ContractError

TASK_MARKERS = ("rtt.task_id", "rtt.app")
STATUSES = ("ok", "failed", "cancelled")
_RFC3339 = re.compile(r"^(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})$")


@dataclasses.dataclass
class SpanBatch:
    """The outcome of converting one span document: completions, spans skipped (no task), bad spans."""

    completions: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    skipped: int = 0
    errors: list[ContractError] = dataclasses.field(default_factory=list)

    def convert(self, span_to_completion: Callable[..., dict[str, Any] | None], *args: Any) -> None:
        """Convert one span and file the outcome: a completion, a skip (not a task) or an error."""
        try:
            c = span_to_completion(*args)
        except ContractError as exc:
            self.errors.append(exc)
            return
        if c is None:
            self.skipped += 1
        else:
            self.completions.append(c)


def parse_rfc3339(text: Any) -> float:
    """Unix seconds of an RFC 3339 timestamp (nanosecond fractions allowed).

    >>> parse_rfc3339("2026-12-01T10:00:00.123456789Z")
    1796119200.1234567
    """
    m = _RFC3339.match(text) if isinstance(text, str) else None
    if not m:
        raise ContractError("bad_span", f"not an RFC 3339 timestamp: {text!r}")
    date, clock, frac, zone = m.groups()
    try:
        dt = datetime.fromisoformat(f"{date}T{clock}{'+00:00' if zone in 'Zz' else zone}")
    except ValueError as exc:
        raise ContractError("bad_span", f"not an RFC 3339 timestamp: {text!r}: {exc}") from None
    return dt.timestamp() + (int(frac.ljust(9, "0")) / 1e9 if frac else 0.0)


def _number(key: str, v: Any) -> float:
    if isinstance(v, bool):
        raise ContractError("bad_span", f"{key}: expected a number, got {v!r}")
    if isinstance(v, int | float):
        f = float(v)
    elif isinstance(v, str):
        try:
            f = float(v)
        except ValueError:
            f = parse_rfc3339(v)
    else:
        raise ContractError("bad_span", f"{key}: expected a number, got {v!r}")
    if not math.isfinite(f):
        raise ContractError("bad_span", f"{key}: not finite")
    return f


def _first(*candidates: Any) -> Any:
    return next((c for c in candidates if c not in (None, "")), None)


def is_task(attrs: Mapping[str, Any]) -> bool:
    return any(attrs.get(k) not in (None, "") for k in TASK_MARKERS)


def completion_from_span(*, span_id: str, name: str, service: str | None, start_s: float, end_s: float,
                         attrs: Mapping[str, Any], resource: Mapping[str, Any], error: bool) -> dict[str, Any] | None:
    """The task-completion of one span, or None when the span is not a task."""
    if not is_task(attrs):
        return None
    node = _first(attrs.get("k8s.node.name"), resource.get("k8s.node.name"), attrs.get("host.name"),
                  resource.get("host.name"), resource.get("hostname"))
    if node is None:
        raise ContractError("bad_span", "task span without k8s.node.name or host.name")
    if end_s < start_s:
        raise ContractError("bad_span", f"span ends before it starts ({end_s} < {start_s})")
    submitted = _number("rtt.submitted_ts", attrs["rtt.submitted_ts"]) if "rtt.submitted_ts" in attrs else start_s
    if submitted > end_s:
        raise ContractError("bad_span", "rtt.submitted_ts is after the span's end")
    status = attrs.get("rtt.status")
    if status is not None and status not in STATUSES:
        raise ContractError("bad_span", f"rtt.status must be one of {list(STATUSES)} (got {status!r})")
    out: dict[str, Any] = {
        "task_id": str(_first(attrs.get("rtt.task_id"), span_id)),
        "app": str(_first(attrs.get("rtt.app"), name, service)),
        "node": str(node),
        "submitted_ts": submitted,
        "started_ts": start_s,
        "finished_ts": end_s,
        "rtt_ms": (end_s - submitted) * 1000.0,
        "status": status or ("failed" if error else "ok"),
    }
    if attrs.get("rtt.input_size_mb") is not None:
        out["input_size_mb"] = _number("rtt.input_size_mb", attrs["rtt.input_size_mb"])
    return validate("task-completions", out)
