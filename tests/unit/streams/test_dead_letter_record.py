"""Dead-letter records satisfy their contract and keep the raw bytes."""

from __future__ import annotations

import base64
import dataclasses

from app.contracts import decode, encode
from app.contracts.edge import EdgeDecoder
from app.errors import ContractError
from app.streams.deadletter import MAX_RAW_BYTES, dead_letter_record


@dataclasses.dataclass
class Msg:
    value: bytes | None
    key: bytes | None
    partition: int = 2
    offset: int = 17


def test_record_from_a_failed_decode() -> None:
    raw = b"\x00\xffgarbage"
    try:
        EdgeDecoder("node-metrics")(raw)
    except ContractError as exc:
        rec = dead_letter_record(Msg(raw, b"node-1"), "node-metrics", exc, 1700000000.0)
    assert decode("dead-letters", encode("dead-letters", rec)) == rec
    assert rec["reason"] == "invalid_json" and rec["key"] == "node-1" and rec["offset"] == 17
    assert base64.b64decode(rec["raw"]) == raw


def test_huge_and_empty_payloads() -> None:
    exc = ContractError("too_large", "x")
    rec = dead_letter_record(Msg(b"a" * (MAX_RAW_BYTES + 10), None), "node-metrics", exc, 1.0)
    assert len(base64.b64decode(rec["raw"])) == MAX_RAW_BYTES and rec["key"] is None
    rec = dead_letter_record(Msg(None, None), "node-metrics", ContractError("empty"), 1.0)
    assert rec["raw"] == "" and decode("dead-letters", encode("dead-letters", rec))
