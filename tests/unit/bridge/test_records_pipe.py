"""A first line cut short (what a restart of ``tail -F … | rttsched publish`` can hand over) on an open pipe is one
invalid line, and the lines after it are read at once. It used to be taken as the start of a pretty-printed
document and the rest of the pipe read to its end -- under ``tail -F``, never: nothing was published and the
memory grew. A pretty-printed document on a pipe is one record as soon as its last line is read (it used to be
one invalid line per line), one past the bound one invalid record."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import orjson
import pytest

from app.bridge import records
from app.bridge.records import Record, read_records

GOOD = {"task_id": "t-1", "app": "gCTF", "node": "worker-1", "submitted_ts": 1.0, "started_ts": 2.0,
        "finished_ts": 5.0, "rtt_ms": 4000.0, "status": "ok"}
CUT = b'{"resourceSpans":[{"resource":{"attri'


class OpenPipe:
    """``read_records`` of a pipe, in a thread, while the test writes to the pipe and keeps it open."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        self.got: list[Record] = []
        self.pipe = open(self.r, "rb")  # noqa: SIM115 - closed by close()
        self.reading = threading.Thread(target=self._read, daemon=True)
        self.reading.start()

    def _read(self) -> None:
        for rec in read_records(self.pipe):
            self.got.append(rec)  # each as soon as it is read

    def write(self, data: bytes) -> None:
        os.write(self.w, data)

    def wait_for(self, n: int, timeout_s: float = 5.0) -> list[Record]:
        deadline = time.monotonic() + timeout_s
        while len(self.got) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.reading.is_alive()  # it reads on: the pipe is open
        return list(self.got)

    def close(self) -> None:
        os.close(self.w)  # the end of the input: the reading ends
        self.reading.join(5.0)
        assert not self.reading.is_alive()
        self.pipe.close()


@pytest.fixture
def open_pipe() -> Iterator[OpenPipe]:
    p = OpenPipe()
    try:
        yield p
    finally:
        if p.reading.is_alive():
            p.close()


def said(got: list[Record]) -> list[tuple[int, str]]:
    return [(rec.line, rec.error.reason if rec.error else rec.doc["task_id"]) for rec in got]


@pytest.mark.parametrize("cut", [CUT, b'{"resourceSpans":[', b'{"task_id": "t-0", "app": '],
                         ids=["in-a-string", "after-a-bracket", "after-a-colon"])
def test_a_truncated_first_line_on_an_open_pipe_is_invalid_and_the_lines_after_it_are_read(
        open_pipe: OpenPipe, cut: bytes) -> None:
    """Wherever it was cut: the next line, a record by itself, is never taken as more of it."""
    open_pipe.write(cut + b"\n" + orjson.dumps(GOOD) + b"\n" + orjson.dumps({**GOOD, "task_id": "t-2"}) + b"\n")
    assert said(open_pipe.wait_for(3)) == [(1, "invalid_json"), (2, "t-1"), (3, "t-2")], \
        "the lines after the cut one were not read"
    open_pipe.close()
    assert len(open_pipe.got) == 3


def test_a_pretty_printed_document_on_an_open_pipe_is_one_record_once_its_last_line_is_read(
        open_pipe: OpenPipe) -> None:
    pretty = orjson.dumps(GOOD, option=orjson.OPT_INDENT_2) + b"\n"
    head, last = pretty[:-2], pretty[-2:]  # all but the closing brace
    open_pipe.write(head)
    time.sleep(0.2)
    assert open_pipe.got == []  # gathered, not invalid lines
    open_pipe.write(last + orjson.dumps({**GOOD, "task_id": "t-2"}) + b"\n" + pretty.replace(b"t-1", b"t-3"))
    assert said(open_pipe.wait_for(3)) == [(1, "t-1"), (11, "t-2"), (12, "t-3")]
    open_pipe.close()


def test_a_document_past_the_bound_on_a_pipe_is_one_invalid_record(open_pipe: OpenPipe,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "MAX_DOCUMENT_BYTES", 100)
    pretty = orjson.dumps({"spans": [GOOD, GOOD]}, option=orjson.OPT_INDENT_2) + b"\n"
    lines = pretty.count(b"\n")
    open_pipe.write(pretty + orjson.dumps(GOOD) + b"\n")
    got = open_pipe.wait_for(2)
    assert said(got) == [(1, "too_large"), (lines + 1, "t-1")]  # its lines one record, and the line after it
    assert str(got[0].error) == (f"too_large: a JSON document over lines 1-{lines} of more than 100 bytes: give it "
                                 "as a file, or write it one record per line (jq -c)")
    stripped = b"\n".join(line.strip() for line in pretty.splitlines())
    assert len(got[0].raw) > 100 and stripped.startswith(got[0].raw)  # its first lines, for a dead letter
    open_pipe.close()


def test_a_pretty_printed_document_in_a_regular_file_is_still_one_record(tmp_path) -> None:
    p = tmp_path / "export.json"
    p.write_bytes(orjson.dumps(GOOD, option=orjson.OPT_INDENT_2))
    with open(p, "rb") as f:
        recs = list(read_records(f))
    assert [(rec.line, rec.error, rec.doc) for rec in recs] == [(1, None, GOOD)]


PRETTY = [orjson.dumps({**GOOD, "task_id": f"t-{n}"}, option=orjson.OPT_INDENT_2) + b"\n" for n in (1, 2, 3)]
CUT_PRETTY = b'{\n  "task_id": "cut",\n'  # a pretty-printed document cut short (its writer restarted)


def test_a_pretty_printed_document_cut_short_on_an_open_pipe_does_not_hold_back_the_documents_after_it(
        open_pipe: OpenPipe) -> None:
    """A document's first line at column 0 ends the gathering of one cut short: the cut one's first line is
    invalid, its other lines are read anew, and each document after it is a record while the pipe stays open.
    They used to be gathered with the cut one, whose brace never closes: nothing until the writer closed the pipe
    (under ``tail -F``, never), then every line invalid."""
    open_pipe.write(CUT_PRETTY + b"".join(PRETTY))
    lines = PRETTY[0].count(b"\n")
    assert said(open_pipe.wait_for(5)) == [(1, "invalid_json"), (2, "invalid_json"), (3, "t-1"),
                                           (3 + lines, "t-2"), (3 + 2 * lines, "t-3")]
    open_pipe.close()
    assert len(open_pipe.got) == 5


def test_the_lines_of_a_gathering_that_ends_are_gathered_anew(open_pipe: OpenPipe) -> None:
    """Documents indented as a whole (no line at column 0) after a cut one: gathered with it until the end of the
    input, then its first line is invalid and the lines after it are read anew -- gathered again, so each
    document is one record (each of their lines used to be one invalid line)."""
    indented = b"".join(b"  " + line + b"\n" for doc in PRETTY for line in doc.splitlines())
    open_pipe.write(CUT_PRETTY + indented)
    open_pipe.close()
    lines = PRETTY[0].count(b"\n")
    assert said(open_pipe.got) == [(1, "invalid_json"), (2, "invalid_json"), (3, "t-1"), (3 + lines, "t-2"),
                                   (3 + 2 * lines, "t-3")]


def test_a_document_on_lines_that_are_not_indented_is_still_one_record_from_a_file(tmp_path) -> None:
    """The column-0 rule is for a stream: a regular file that is one document is read whole first."""
    p = tmp_path / "export.json"
    p.write_bytes(b'{\n"spans": [\n{\n"a": 1\n}\n]\n}\n')
    with open(p, "rb") as f:
        assert [(r.line, r.doc) for r in read_records(f)] == [(1, {"spans": [{"a": 1}]})]
