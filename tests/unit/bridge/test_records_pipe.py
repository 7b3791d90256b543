"""A first line cut short (what a restart of ``tail -F … | rttsched publish`` can hand over) on an open pipe is one
invalid line, and the lines after it are read at once. It used to be taken as the start of a pretty-printed
document and the rest of the pipe read to its end -- under ``tail -F``, never: nothing was published and the
memory grew."""

from __future__ import annotations

import os
import threading
import time

import orjson

from app.bridge.records import Record, read_records

GOOD = {"task_id": "t-1", "app": "gCTF", "node": "worker-1", "submitted_ts": 1.0, "started_ts": 2.0,
        "finished_ts": 5.0, "rtt_ms": 4000.0, "status": "ok"}
CUT = b'{"resourceSpans":[{"resource":{"attri'


def test_a_truncated_first_line_on_an_open_pipe_is_invalid_and_the_lines_after_it_are_read() -> None:
    r, w = os.pipe()
    got: list[Record] = []
    with open(r, "rb") as pipe:
        def read() -> None:
            for rec in read_records(pipe):
                got.append(rec)

        reading = threading.Thread(target=read, daemon=True)
        try:
            os.write(w, CUT + b"\n" + orjson.dumps(GOOD) + b"\n" + orjson.dumps({**GOOD, "task_id": "t-2"}) + b"\n")
            reading.start()
            deadline = time.monotonic() + 5.0
            while len(got) < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert [(rec.line, rec.error.reason if rec.error else rec.doc["task_id"]) for rec in got] == [
                (1, "invalid_json"), (2, "t-1"), (3, "t-2")], "the lines after the cut one were not read"
            assert reading.is_alive()  # and it reads on: the pipe is open
        finally:
            os.close(w)  # the end of the input: the reading ends (the old code's read() too)
        reading.join(5.0)
        assert not reading.is_alive()
    assert len(got) == 3


def test_a_pretty_printed_document_in_a_regular_file_is_still_one_record(tmp_path) -> None:
    p = tmp_path / "export.json"
    p.write_bytes(orjson.dumps(GOOD, option=orjson.OPT_INDENT_2))
    with open(p, "rb") as f:
        recs = list(read_records(f))
    assert [(rec.line, rec.error, rec.doc) for rec in recs] == [(1, None, GOOD)]
