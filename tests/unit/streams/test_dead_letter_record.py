"""Dead-letter records satisfy their contract and keep the raw bytes."""

from __future__ import annotations

import base64
import dataclasses

from app.contracts import decode, encode
from app.contracts.dead import MAX_RAW_BYTES, dead_letter_record
from app.contracts.edge import EdgeDecoder
from app.errors import ContractError


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


def test_dead_letters_are_counted_once_stored_in_order_and_sent_again_when_refused(tmp_path) -> None:
    import asyncio

    import orjson
    from aiokafka.errors import KafkaTimeoutError

    from app.config import Settings
    from app.streams.app import create_app
    from app.streams.deadletter import DeadLetters
    from app.streams.options import WorkerOptions

    settings = Settings.from_env({"RTT_METRICS_PORT": "0", "RTT_RETRY_MAX_BACKOFF_S": "0.01"})
    app = create_app(settings, id="dead", options=WorkerOptions.from_settings(settings, datadir=str(tmp_path)))

    class Topic:  # the broker refuses the second message once, then takes everything
        def __init__(self) -> None:
            self.stored: list[int] = []
            self.refusals = 1

        async def send(self, key: bytes, value: bytes) -> asyncio.Future[None]:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            offset = orjson.loads(value)["offset"]
            if offset == 2 and self.refusals:
                self.refusals -= 1
                fut.set_exception(KafkaTimeoutError())
            else:
                self.stored.append(offset)
                fut.set_result(None)
            return fut

    dead = DeadLetters(app, settings)
    dead.topic = Topic()  # type: ignore[assignment]
    bad = [(Msg(b"{", b"n1", offset=o), "node-metrics", ContractError("invalid_json", "x")) for o in (1, 2, 3)]
    asyncio.run(dead.send_all(bad))
    assert dead.topic.stored == [1, 3, 2]  # in order, the refused one sent again
    assert dead.sent == 3
    assert dead.metrics.value("rtt_worker_dead_letters_total", topic="node-metrics", reason="invalid_json") == 3
