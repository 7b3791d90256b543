"""Input records for ``rttsched publish``: JSON lines (or one JSON document) -> contract values or problems.

A file is read as JSON lines (blank lines ignored). When its first non-blank line is not JSON by itself but
the whole file is -- a pretty-printed span export -- the whole file is one record. That is tried only for a
regular file (and an in-memory stream): on a pipe or a FIFO, whose end may never come (``tail -F``), a first
line that is not JSON -- one cut short when the pipeline restarted -- is an invalid line like any other and
the lines after it are read on. Each record is converted according to ``source``:

``values``   the record is a value of the topic, checked against the topic's contract
``jaeger``   the record is a Jaeger JSON span (Kafka encoding), a list of them, or a query-API
             response (``/api/traces``)                          -> task-completions
``otlp``     the record is an OTLP JSON trace export                -> task-completions

With :class:`~app.bridge.spans.SpanOptions` (a node map, the nodes that have metrics) spans find their
node as :mod:`app.bridge.spans` says, and a completion on a node without metrics is a problem
(``unknown_node``) -- task-completion values included.

Nothing here raises for bad input: a bad record becomes a :class:`Problem` with its line number and the
contract's stable ``reason`` -- a line that is not UTF-8 too (``invalid_json``, as the worker's decoder says of
such a message), so one bad line never stops the lines after it.

>>> import io
>>> recs = list(read_records(io.BytesIO(b'{"a": 1}\\n\\nnot json\\n\\xff\\n')))
>>> [(r.line, r.error.reason if r.error else r.doc) for r in recs]
[(1, {'a': 1}), (3, 'invalid_json'), (4, 'invalid_json')]
>>> str(recs[-1].error)
'invalid_json: not UTF-8: byte 0xff at column 1'
"""

from __future__ import annotations

import collections
import dataclasses
import io
import os
import stat
from collections.abc import Iterator
from typing import Any, BinaryIO

import orjson

from app.bridge.jaeger import jaeger_to_completions
from app.bridge.otlp import otlp_to_completions
from app.bridge.spans import SpanOptions, check_attribution
from app.contracts.admission import check_order
from app.contracts.codec import validate
from app.errors import ContractError

SOURCES = ("values", "jaeger", "otlp")


@dataclasses.dataclass(frozen=True)
class Record:
    line: int
    raw: bytes
    doc: Any = None
    error: ContractError | None = None


@dataclasses.dataclass(frozen=True)
class Problem:
    line: int
    raw: bytes
    error: ContractError


@dataclasses.dataclass
class Converted:
    values: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    skipped: int = 0
    problems: list[Problem] = dataclasses.field(default_factory=list)
    fallbacks: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)


def _parse(line: int, raw: bytes) -> Record:
    try:
        return Record(line, raw, orjson.loads(raw))
    except orjson.JSONDecodeError as exc:
        detail = str(exc)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as bad:  # said plainly (orjson says "str is not valid UTF-8: surrogates ...")
        detail = f"not UTF-8: byte 0x{raw[bad.start]:02x} at column {bad.start + 1}"
    return Record(line, raw, error=ContractError("invalid_json", detail))


def read_records(stream: BinaryIO) -> Iterator[Record]:
    """The records of a JSON-lines byte stream (or, from a regular file, of one multi-line JSON document). The
    stream is read as bytes, split at ``\\n`` here: a line that is not UTF-8 is a problem of its own, not the
    end of the file."""
    first: Record | None = None
    for n, line in enumerate(stream, start=1):
        raw = line.strip()
        if not raw:
            continue
        rec = _parse(n, raw)
        if first is None:
            first = rec
            if rec.error is not None and raw[:1] in (b"{", b"[") and _has_an_end(stream):
                rest = raw + b"\n" + stream.read()
                whole = _parse(n, rest)
                if whole.error is None:
                    yield whole
                    return
                yield from _lines(rest, n)
                return
        yield rec


def _has_an_end(stream: BinaryIO) -> bool:
    """Whether reading ``stream`` to its end returns: a regular file, or an in-memory stream -- not a pipe, a
    FIFO, a terminal or a socket, whose end comes only when the writer closes it (under ``tail -F``, never).

    >>> import io, os
    >>> _has_an_end(io.BytesIO(b"{"))
    True
    >>> with open(__file__, "rb") as f:
    ...     _has_an_end(f)
    True
    >>> r, w = os.pipe()
    >>> with open(r, "rb") as pipe:
    ...     _has_an_end(pipe)
    False
    >>> os.close(w)
    """
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both; no file descriptor
        return isinstance(stream, io.BytesIO)
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        return False


def _lines(data: bytes, start: int) -> Iterator[Record]:
    for i, raw in enumerate(data.split(b"\n")):
        raw = raw.strip()
        if raw:
            yield _parse(start + i, raw)


def convert(record: Record, topic: str, source: str = "values", options: SpanOptions | None = None) -> Converted:
    """Turn one record into values for ``topic`` (see the module doc for ``source``, one of :data:`SOURCES`)."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)} (got {source!r})")
    out = Converted()
    if record.error is not None:
        out.problems.append(Problem(record.line, record.raw, record.error))
        return out
    try:
        if source == "values":
            value = validate(topic, record.doc)
            check_order(topic, value)
            if topic == "task-completions" and options is not None:
                check_attribution(value["node"], "node", options.known_nodes)
            out.values.append(value)
            return out
        convert_spans = jaeger_to_completions if source == "jaeger" else otlp_to_completions
        batch = convert_spans(record.doc, options)
    except ContractError as exc:
        out.problems.append(Problem(record.line, record.raw, exc))
        return out
    out.values.extend(batch.completions)
    out.skipped = batch.skipped
    out.fallbacks = batch.fallbacks
    out.problems.extend(Problem(record.line, record.raw, e) for e in batch.errors)
    return out
