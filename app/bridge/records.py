"""Input records for ``rttsched publish``: JSON lines (or one JSON document) -> contract values or problems.

A file is read as JSON lines (blank lines ignored). When its first non-blank line is not JSON by itself but
the whole file is -- a pretty-printed span export -- the whole file is one record. That is tried only for a
regular file (and an in-memory stream): a pipe or a FIFO may never end (``tail -F``). There, and in a file that
is not one document, a line that is not JSON by itself but opens a bracket is gathered with the lines after it
while their brackets stay open (:mod:`app.bridge.brackets`). Once all are closed, the lines gathered are one
record if they parse as one JSON value -- a pretty-printed document, piped --, else each line is read by
itself. The gathering stops short at a line that cannot continue it (a closing bracket that matches none, a
line break inside a string: a line cut short), at a line that begins a document (``{`` or ``[`` at column 0,
where ``jq`` and ``json.dumps(..., indent=2)`` begin one and never an inner line), at a line that is a JSON
object or array by itself (a record of its own, never held back) and at the end of the input: the first line
gathered is then an invalid line, the others are read anew -- gathered again, so a whole document among them is
a record --, then the line that stopped it. So a document cut short holds back none after it. A document of more
than :data:`MAX_DOCUMENT_BYTES` is one invalid record (``too_large``) for all its lines, read to its end and not
kept. So a line that is a whole record is never delayed; a line that is not JSON and leaves a bracket open is
reported once the next line shows that it goes nowhere. Each record is converted according to ``source``:

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
>>> recs = list(read_records(io.BytesIO(b'{"a": 1}\\n[\\n  1,\\n  2\\n]\\n{"b": [\\n{"c": 2}\\n')))
>>> [(r.line, r.error.reason if r.error else r.doc) for r in recs]
[(1, {'a': 1}), (2, [1, 2]), (6, 'invalid_json'), (7, {'c': 2})]
>>> recs = list(read_records(io.BytesIO(b'{\\n  "task_id": "cut",\\n{\\n  "a": 1\\n}\\n')))
>>> [(r.line, r.error.reason if r.error else r.doc) for r in recs]
[(1, 'invalid_json'), (2, 'invalid_json'), (3, {'a': 1})]
"""

from __future__ import annotations

import collections
import dataclasses
import io
import itertools
import os
import stat
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

import orjson

from app.bridge.brackets import BROKEN, CLOSED, Brackets
from app.bridge.jaeger import jaeger_to_completions
from app.bridge.otlp import otlp_to_completions
from app.bridge.spans import SpanOptions, check_attribution
from app.contracts.admission import check_order
from app.contracts.codec import validate
from app.contracts.dead import MAX_RAW_BYTES
from app.errors import ContractError

SOURCES = ("values", "jaeger", "otlp")
MAX_DOCUMENT_BYTES = 64 << 20  # a document gathered from lines, at most (its lines in memory, then parsed)


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
    """The records of a JSON-lines byte stream, a document spread over lines gathered into one (see the module;
    from a regular file, the whole file when it is one multi-line JSON document). The stream is read as bytes,
    split at ``\\n`` here: a line that is not UTF-8 is a problem of its own, not the end of the file."""
    lines = _numbered(stream)
    for n, raw, top in lines:  # the first line that is not blank
        if not raw:
            continue
        if raw[:1] in (b"{", b"[") and _parse(n, raw).error is not None and _has_an_end(stream):
            rest = raw + b"\n" + stream.read()
            whole = _parse(n, rest)
            if whole.error is None:
                yield whole
                return
            yield from _gathered(_numbered(rest.split(b"\n"), start=n))
            return
        yield from _gathered(itertools.chain([(n, raw, top)], lines))
        return


def _numbered(lines: Iterable[bytes], start: int = 1) -> Iterator[tuple[int, bytes, bool]]:
    """Each line's number, the line stripped, and whether it begins with ``{`` or ``[`` at column 0: the first line
    of a document as ``jq`` and ``json.dumps(..., indent=2)`` write it (its inner lines indented)."""
    for n, line in enumerate(lines, start=start):
        yield n, line.strip(), line[:1] in (b"{", b"[")


_FRESH, _ANEW, _ALONE = 0, 1, 2  # a line read for the first time; read anew (it may begin a gathering); alone


def _gathered(lines: Iterable[tuple[int, bytes, bool]]) -> Iterator[Record]:
    """The records of numbered lines (:func:`_numbered`), a document spread over lines gathered into one.

    A gathering that ends without a record (a line that cannot go on, one that begins a document at column 0, one
    that is a record by itself, the end of the input) makes its first line invalid and reads the lines after it
    anew, gathered again: a whole document among them is a record. The lines of a gathering that began on a
    line read anew are read each by itself when it ends, so that no line is read more than a few times."""
    source = iter(lines)
    again: collections.deque[tuple[int, bytes, bool, int]] = collections.deque()  # read before source
    gathered: list[tuple[int, bytes, bool]] = []  # the lines of the document under way
    how = replayed = _FRESH  # how the line under way is read; how the gathering's first line was
    size = 0
    brackets = Brackets()
    past: tuple[int, int, bytes] | None = None  # a document past the bound: its first and last line, first bytes
    ended = False  # the source is exhausted (a terminal is not read again after its end)
    while True:
        if again:
            n, raw, top, how = again.popleft()
        else:
            item = None if ended else next(source, None)
            if item is None:
                ended = True
                if past is not None:
                    yield _too_large(*past)
                    past = None
                if not gathered:
                    return
                yield from _ends(gathered, replayed, again)
                gathered = []
                continue
            (n, raw, top), how = item, _FRESH
        if not raw:
            continue
        if how == _ALONE:
            yield _parse(n, raw)
            continue
        if past is not None:
            if not (top or _whole(raw)):
                state = brackets.feed(raw + b"\n")
                if state != BROKEN:
                    past = (past[0], n, past[2])
                    if state == CLOSED:
                        yield _too_large(*past)
                        past = None
                    continue
            yield _too_large(*past)  # and this line is read anew
            past = None
        elif gathered:
            state = BROKEN if top or _whole(raw) else brackets.feed(raw + b"\n")
            if state != BROKEN:
                gathered.append((n, raw, top))
                size += len(raw) + 1
                if state == CLOSED:
                    yield from _document(gathered)
                    gathered = []
                elif size > MAX_DOCUMENT_BYTES:
                    head = b"\n".join(r for _, r, _ in gathered)[:MAX_RAW_BYTES]
                    past, gathered = (gathered[0][0], n, head), []
                continue
            again.appendleft((n, raw, top, how))  # this line is read anew, after those gathered
            yield from _ends(gathered, replayed, again)
            gathered = []
            continue
        rec = _parse(n, raw)
        if rec.error is not None and raw[:1] in (b"{", b"["):
            brackets = Brackets()
            if brackets.feed(raw + b"\n") not in (BROKEN, CLOSED):
                gathered, size, replayed = [(n, raw, top)], len(raw), how
                continue
        yield rec


def _ends(gathered: list[tuple[int, bytes, bool]], replayed: int,
          again: collections.deque[tuple[int, bytes, bool, int]]) -> Iterator[Record]:
    """A gathering that ends without a record: its first line invalid, the others put first in ``again`` -- to be
    gathered anew, or read alone when the gathering began on a line read anew (``replayed``)."""
    yield _parse(gathered[0][0], gathered[0][1])
    how = _ALONE if replayed != _FRESH else _ANEW
    again.extendleft((m, r, t, how) for m, r, t in reversed(gathered[1:]))


def _document(gathered: list[tuple[int, bytes, bool]]) -> Iterator[Record]:
    """The gathered lines, their brackets all closed: one record if they parse as one value, else each alone."""
    whole = _parse(gathered[0][0], b"\n".join(r for _, r, _ in gathered))
    if whole.error is None:
        yield whole
    else:
        yield from (_parse(n, r) for n, r, _ in gathered)


def _whole(raw: bytes) -> bool:
    """Whether the line ``raw`` is by itself a JSON object or array with something in it: a record of its own.

    >>> _whole(b'{"a": 1}'), _whole(b'[]'), _whole(b'{"a": 1},'), _whole(b'"a"')
    (True, False, False, False)
    """
    if raw[:1] not in (b"{", b"[") or raw[-1:] not in (b"}", b"]"):
        return False
    try:
        return bool(orjson.loads(raw))
    except orjson.JSONDecodeError:
        return False


def _too_large(first: int, last: int, head: bytes) -> Record:
    return Record(first, head, error=ContractError(
        "too_large", f"a JSON document over lines {first}-{last} of more than {MAX_DOCUMENT_BYTES:,} bytes: give it as "
                     "a file, or write it one record per line (jq -c)"))


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
