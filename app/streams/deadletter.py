"""Dead letters: a message that fails decoding or its contract is recorded, counted and skipped.

Every intake (:class:`~app.streams.intake.PartitionIntake`) hands a message it cannot decode to
:meth:`DeadLetters.send`: the dead-letters topic (contract ``topics/dead-letters.json``) gets its source
topic, partition, offset, error, stable ``reason``, raw bytes (base64), key and time, and
``rtt_worker_dead_letters_total{topic, reason}`` counts it. The intake goes on with the next message.
"""

from __future__ import annotations

import base64
import logging
from typing import Any

import faust

from app.clock import Clock, SystemClock
from app.config import Settings
from app.contracts import encode
from app.errors import ContractError
from app.streams.metrics import WorkerMetrics
from app.streams.topics import contract_topic

log = logging.getLogger(__name__)

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


class DeadLetters:
    """Sends dead letters for one app to ``settings.topic("dead-letters")``, counted in ``metrics``."""

    def __init__(self, app: faust.App, settings: Settings, clock: Clock | None = None,
                 metrics: WorkerMetrics | None = None) -> None:
        self.topic = contract_topic(app, settings, "dead-letters")
        self.clock = clock or SystemClock()
        self.metrics = metrics if metrics is not None else WorkerMetrics()
        self.sent = 0

    async def send(self, message: Any, source: str, exc: ContractError) -> None:
        record = dead_letter_record(message, source, exc, self.clock.now())
        self.metrics.dead_letters.labels(source, exc.reason).inc()
        self.metrics.messages_out.labels("dead-letters").inc()
        log.debug("dead letter from %s[%s]@%s: %s", source, record["partition"], record["offset"], exc)
        await self.topic.send(key=record["topic"].encode(), value=encode("dead-letters", record))
        self.sent += 1
