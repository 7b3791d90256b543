"""Tracing spans -> task-completions: the attribute conventions shared by the Jaeger and OTLP converters.

A span is a **task** when it carries ``rtt.task_id`` or ``rtt.app`` among its own attributes (tags), or
when it is a root span (no parent) of a resource (Jaeger: process) that carries ``rtt.app``; every other
span is skipped and counted. For a task span:

============== ===================================================================================
field          taken from (first that is present)
============== ===================================================================================
task_id        ``rtt.task_id``; the span id (hex)
app            ``rtt.app`` on the span, then on the resource; else the span name, then the service name,
               made a Kubernetes label value (:func:`label_value`; a name with nothing left is passed over)
node           ``k8s.node.name`` on the span, then on the resource; the node map's entry for the
               span's or resource's ``k8s.pod.name``, ``host.name`` or ``hostname``; ``host.name``,
               then Jaeger's process tag ``hostname`` -- a *fallback*: in Kubernetes these name the pod,
               not the node, so each use is counted (:attr:`SpanBatch.fallbacks`) and warned about
submitted_ts   ``rtt.submitted_ts`` (unix seconds, or an RFC 3339 string); the span's start
started_ts     the span's start
finished_ts    the span's end (start + duration)
rtt_ms         (finished_ts - submitted_ts) * 1000: the response time the user saw, queueing included
status         ``rtt.status`` (ok | failed | cancelled); ``failed`` when the span is an error (Jaeger tag
               ``error=true``, ``otel.status_code=ERROR``, OTLP status code 2); else ``ok``
input_size_mb  ``rtt.input_size_mb`` when present
============== ===================================================================================

A task span that lacks what a completion needs (no node, no app, bad times, end before start) raises
:class:`~app.errors.ContractError` (``bad_span``); so does a result that breaks the task-completions
contract (an ``rtt.app`` that is no label value, say). With :attr:`SpanOptions.known_nodes` (the nodes that
have metrics), a completion on any other node raises ``unknown_node``: it could never join its node's
features, so it is reported (or dead-lettered) rather than published.

>>> completion_from_span(span_id="00000000000000ab", name="gCTF", service="cryoem", start_s=100.0, end_s=112.5,
...                      attrs={"rtt.task_id": "t-1", "k8s.node.name": "worker-1"}, resource={}, error=False)[0]
{'task_id': 't-1', 'app': 'gCTF', 'node': 'worker-1', 'submitted_ts': 100.0, 'started_ts': 100.0, \
'finished_ts': 112.5, 'rtt_ms': 12500.0, 'status': 'ok'}
>>> completion_from_span(span_id="00000000000000ab", name="POST /upload", service="cryoem", start_s=100.0,
...                      end_s=101.0, attrs={"rtt.task_id": "t-2", "k8s.node.name": "worker-1"}, resource={},
...                      error=False)[0]["app"]
'POST-upload'
>>> resolve_node({}, {"k8s.pod.name": "runner-x2k4q", "host.name": "runner-x2k4q"}, {"runner-x2k4q": "worker-2"})
('worker-2', 'node_map')
>>> resolve_node({}, {"host.name": "runner-x2k4q"}, {})
('runner-x2k4q', 'host.name')
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from typing import Any

from app.contracts.codec import validate
from app.errors import ContractError

TASK_MARKERS = ("rtt.task_id", "rtt.app")
STATUSES = ("ok", "failed", "cancelled")
NODE_ATTRIBUTE = "k8s.node.name"
MAPPED_ATTRIBUTES = ("k8s.pod.name", "host.name", "hostname")  # looked up in the node map, in this order
FALLBACK_ATTRIBUTES = ("host.name", "hostname")  # used as the node name itself, counted and warned about
LABEL_VALUE_MAX = 63  # characters of a Kubernetes label value (the pods' app label)
_NOT_LABEL = re.compile(r"[^-A-Za-z0-9_.]+")
_RFC3339 = re.compile(r"^(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})$")


@dataclasses.dataclass(frozen=True)
class SpanOptions:
    """How spans find their node: a map from pod or host names, and the nodes that have metrics."""

    node_map: Mapping[str, str] = dataclasses.field(default_factory=dict)
    known_nodes: Collection[str] | None = None  # None: attribution not checked


Result = tuple[dict[str, Any], str]  # (completion, where its node came from)


@dataclasses.dataclass
class SpanBatch:
    """The outcome of converting one span document: completions, spans skipped (no task), bad spans.

    ``fallbacks`` counts the completions whose node came from a fallback attribute (``host.name`` ...).
    """

    options: SpanOptions = dataclasses.field(default_factory=SpanOptions)
    completions: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    skipped: int = 0
    errors: list[ContractError] = dataclasses.field(default_factory=list)
    fallbacks: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)

    def convert(self, span_to_completion: Callable[..., Result | None], *args: Any) -> None:
        """Convert one span and file the outcome: a completion, a skip (not a task) or an error."""
        try:
            r = span_to_completion(*args, options=self.options)
            if r is not None:
                check_attribution(r[0]["node"], r[1], self.options.known_nodes)
        except ContractError as exc:
            self.errors.append(exc)
            return
        if r is None:
            self.skipped += 1
            return
        self.completions.append(r[0])
        if r[1] in FALLBACK_ATTRIBUTES:
            self.fallbacks[r[1]] += 1


def check_attribution(node: str, via: str, known: Collection[str] | None) -> None:
    """``unknown_node`` when ``known`` is given and ``node`` is not among them."""
    if known is not None and node not in known:
        hint = " (in Kubernetes that is the pod's name: set k8s.node.name or map it)" if via in FALLBACK_ATTRIBUTES \
            else ""
        raise ContractError("unknown_node", f"node {node!r} from {via}{hint} has no metrics: not one of the "
                                            f"{len(known)} nodes known")


def key_values(raw: Any, value_of: Callable[[Mapping[str, Any]], Any], what: str, shape: str) -> dict[str, Any]:
    """A list of ``{key, ...}`` objects (Jaeger tags, OTLP attributes) as a plain dict; later duplicates win."""
    if raw is None:
        return {}
    if not isinstance(raw, list) or not all(isinstance(t, dict) and isinstance(t.get("key"), str) for t in raw):
        raise ContractError("bad_span", f"{what} must be a list of {shape}")
    return {t["key"]: value_of(t) for t in raw}


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


def label_value(name: Any) -> str:
    """``name`` as a Kubernetes label value, the form of an app name: each run of characters other than letters,
    digits, ``-``, ``_`` and ``.`` becomes one ``-``, cut to 63 characters, a letter or digit at each end
    (``''`` when nothing is left).

    >>> label_value("POST /upload"), label_value("gCTF run"), label_value("grpc:Process"), label_value("上传")
    ('POST-upload', 'gCTF-run', 'grpc-Process', '')
    """
    return _NOT_LABEL.sub("-", str(name))[:LABEL_VALUE_MAX].strip("-_.") if name is not None else ""


def app_of(name: str, service: str | None, attrs: Mapping[str, Any], resource: Mapping[str, Any]) -> str:
    """The app of a task span: ``rtt.app`` (span, then resource) as it is, else the span name, then the service
    name, as label values (:func:`label_value`); ``bad_span`` when none gives one."""
    declared = _first(attrs.get("rtt.app"), resource.get("rtt.app"))
    if declared is not None:
        return str(declared)
    app = label_value(name) or label_value(service)
    if not app:
        raise ContractError("bad_span", f"task span without rtt.app whose name {name!r} and service {service!r} "
                                        f"leave no app name (letters, digits, '-', '_', '.')")
    return app


def tagged_error(attrs: Mapping[str, Any]) -> bool:
    """A Jaeger span whose tags mark it as an error (``error=true``, or OTel's ``otel.status_code=ERROR``).

    >>> tagged_error({"error": "true"}), tagged_error({"otel.status_code": "OK"})
    (True, False)
    """
    return attrs.get("error") in (True, "true") or attrs.get("otel.status_code") == "ERROR"


def is_task(attrs: Mapping[str, Any], resource: Mapping[str, Any], root: bool) -> bool:
    """A span with a task marker, or a root span of a resource that names its app."""
    if any(attrs.get(k) not in (None, "") for k in TASK_MARKERS):
        return True
    return root and resource.get("rtt.app") not in (None, "")


def resolve_node(attrs: Mapping[str, Any], resource: Mapping[str, Any], node_map: Mapping[str, str]) -> tuple[str, str]:
    """(node, where it came from: ``k8s.node.name``, ``node_map``, ``host.name`` or ``hostname``)."""
    node = _first(attrs.get(NODE_ATTRIBUTE), resource.get(NODE_ATTRIBUTE))
    if node is not None:
        return str(node), NODE_ATTRIBUTE
    for key in MAPPED_ATTRIBUTES:
        for where in (attrs, resource):
            name = where.get(key)
            if name not in (None, "") and str(name) in node_map:
                return node_map[str(name)], "node_map"
    for key in FALLBACK_ATTRIBUTES:
        name = _first(attrs.get(key), resource.get(key))
        if name is not None:
            return str(name), key
    raise ContractError("bad_span", f"task span without {NODE_ATTRIBUTE} (span or resource), without a node map "
                                    f"entry for its {' / '.join(MAPPED_ATTRIBUTES)}, and without host.name")


def completion_from_span(*, span_id: str, name: str, service: str | None, start_s: float, end_s: float,
                         attrs: Mapping[str, Any], resource: Mapping[str, Any], error: bool, root: bool = False,
                         options: SpanOptions | None = None) -> Result | None:
    """The task-completion of one span and where its node came from, or None when the span is not a task."""
    if not is_task(attrs, resource, root):
        return None
    node, via = resolve_node(attrs, resource, options.node_map if options else {})
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
        "app": app_of(name, service, attrs, resource),
        "node": node,
        "submitted_ts": submitted,
        "started_ts": start_s,
        "finished_ts": end_s,
        "rtt_ms": (end_s - submitted) * 1000.0,
        "status": status or ("failed" if error else "ok"),
    }
    if attrs.get("rtt.input_size_mb") is not None:
        out["input_size_mb"] = _number("rtt.input_size_mb", attrs["rtt.input_size_mb"])
    return validate("task-completions", out), via
