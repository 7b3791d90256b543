"""Rows a table keeps in memory cost their size, not orjson's output buffer (the soak found 4 KB per row)."""

from __future__ import annotations

import tracemalloc

import orjson

from app.streams.changelog import _apply


def test_kept_rows_are_compact() -> None:
    data: dict[bytes, bytes] = {}
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(10_000):
            _apply(data, f"0|j|gpu-1|task-{i}".encode(), orjson.dumps({"since": 1000.0 + i, "done": True}))
        per_row = (tracemalloc.get_traced_memory()[0] - before) / 10_000
    finally:
        tracemalloc.stop()
    assert per_row < 400, f"{per_row:.0f} B per row kept"
    _apply(data, b"0|j|gpu-1|task-1", None)
    assert len(data) == 9_999 and data[b"0|j|gpu-1|task-2"] == b'{"since":1002.0,"done":true}'
