"""Rows a table keeps in memory: copies of their own size, not orjson's output buffers (the soak found 4 KB per
row; bench/bench_retire.py prints the bytes a kept row costs, copied and not), and only once stored."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import orjson
import pytest

from app.streams.changelog import _apply, write_rows


def test_kept_rows_are_copies_not_the_encoder_s_buffers() -> None:
    data: dict[bytes, bytes] = {}
    encoded = [orjson.dumps({"since": 1000.0 + i, "done": True}) for i in range(10_000)]
    for i, value in enumerate(encoded):
        _apply(data, f"0|j|gpu-1|task-{i}".encode(), value)
    kept = list(data.values())
    assert kept == encoded and all(type(v) is bytes for v in kept)
    assert not any(k is v for k, v in zip(kept, encoded, strict=True))  # orjson's 4 KB buffers are not held
    _apply(data, b"0|j|gpu-1|task-1", None)
    assert len(data) == 9_999 and data[b"0|j|gpu-1|task-2"] == b'{"since":1002.0,"done":true}'


def test_rows_of_a_failed_write_are_written_again_deletions_included() -> None:
    """The table's data follows what was stored: a write that failed leaves it as it was, so the same rows
    go out again (a deletion of a key the data already dropped would have been skipped)."""
    class Sender:
        def __init__(self) -> None:
            self.fail, self.sent = True, []

        def add(self, topic: str, partition: int, key: bytes, value: bytes | None) -> None:
            self.sent.append((key, value))

        async def flush(self) -> int:
            if self.fail:
                self.fail, self.sent = False, []
                raise ConnectionError("broker away")
            return len(self.sent)

        def take_rewound(self, topic: str) -> set[int]:
            return set()

    table = SimpleNamespace(data={b"0|j|n|t1": b"{}"}, changelog_topic=SimpleNamespace(get_topic_name=lambda: "cl"))
    sender = Sender()
    rows = [(0, b"0|j|n|t1", None), (0, b"0|j|n|t2", b'{"done":true}')]
    with pytest.raises(ConnectionError):
        asyncio.run(write_rows(table, rows, sender=sender))  # type: ignore[arg-type]
    assert table.data == {b"0|j|n|t1": b"{}"}
    assert asyncio.run(write_rows(table, rows, sender=sender)) == 2  # type: ignore[arg-type]
    assert (b"0|j|n|t1", None) in sender.sent and table.data == {b"0|j|n|t2": b'{"done":true}'}
