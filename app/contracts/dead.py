"""A dead-letters value for a consumed message that failed its contract (``topics/dead-letters.json``): the
worker's intakes and the trainer build theirs here."""

from __future__ import annotations

import base64
from typing import Any

from app.errors import ContractError

MAX_RAW_BYTES = 65_536  # raw payload kept in a dead letter (base64 of the first bytes)


def _text(b: Any) -> str | None:
    if b is None:
        return None
    return b.decode("utf-8", "replace") if isinstance(b, bytes | bytearray) else str(b)


def dead_letter_value(topic: str, partition: int, offset: int, error: str, reason: str, raw: bytes | bytearray | str,
                      key: str | None, ts: float) -> dict[str, Any]:
    """The dead-letters value of one record: its first :data:`MAX_RAW_BYTES` in base64, the error cut to 2,000
    characters.

    >>> d = dead_letter_value("t", -1, 3, "invalid_json: ...", "invalid_json", b"{", None, 0.0)
    >>> d["raw"], d["offset"]
    ('ew==', 3)
    """
    data = raw.encode() if isinstance(raw, str) else bytes(raw)
    return {"topic": topic, "partition": partition, "offset": offset, "error": error[:2000], "reason": reason,
            "raw": base64.b64encode(data[:MAX_RAW_BYTES]).decode("ascii"), "key": key, "ts": ts}


def dead_letter_record(message: Any, source: str, exc: ContractError, now: float) -> dict[str, Any]:
    """The dead-letters value for ``message`` (a Faust/aiokafka message) that failed with ``exc``.

    ``topic`` (and the dead letter's key) is the real Kafka topic the message came from, prefix included,
    as the bridge writes it; ``source`` (the contract name) is the fallback and the metric label.
    """
    raw = message.value if isinstance(message.value, bytes | bytearray) else _text(message.value) or ""
    return dead_letter_value(str(getattr(message, "topic", None) or source), int(message.partition),
                             int(message.offset), str(exc), exc.reason, raw, _text(message.key), now)
