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


def dead_letter_record(message: Any, source: str, exc: ContractError, now: float) -> dict[str, Any]:
    """The dead-letters value for ``message`` (a Faust/aiokafka message) that failed with ``exc``.

    ``topic`` (and the dead letter's key) is the real Kafka topic the message came from, prefix included,
    as the bridge writes it; ``source`` (the contract name) is the fallback and the metric label.
    """
    raw = message.value if isinstance(message.value, bytes | bytearray) else _text(message.value) or ""
    raw_b = raw.encode() if isinstance(raw, str) else bytes(raw)
    return {
        "topic": str(getattr(message, "topic", None) or source),
        "partition": int(message.partition), "offset": int(message.offset),
        "error": str(exc)[:2000], "reason": exc.reason,
        "raw": base64.b64encode(raw_b[:MAX_RAW_BYTES]).decode("ascii"),
        "key": _text(message.key), "ts": now,
    }
