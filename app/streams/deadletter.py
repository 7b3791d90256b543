"""Dead letters: a message that fails decoding or its contract is recorded, counted and skipped.

Every intake (:class:`~app.streams.intake.PartitionIntake`) hands a message it cannot decode to
:meth:`DeadLetters.send`: the dead-letters topic (contract ``topics/dead-letters.json``) gets its source
topic, partition, offset, error, stable ``reason``, raw bytes (base64), key and time, and
``rtt_worker_dead_letters_total{topic, reason}`` counts it. The intake goes on with the next message.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import faust
from aiokafka.errors import KafkaError

from app.clock import Clock, SystemClock
from app.config import Settings
from app.contracts import encode
from app.contracts.dead import dead_letter_record
from app.errors import ContractError
from app.retry import Backoff
from app.streams.metrics import WorkerMetrics
from app.streams.topics import await_delivery, contract_topic

log = logging.getLogger(__name__)

class DeadLetters:
    """Sends dead letters for one app to ``settings.topic("dead-letters")``, counted in ``metrics``."""

    def __init__(self, app: faust.App, settings: Settings, clock: Clock | None = None,
                 metrics: WorkerMetrics | None = None) -> None:
        self.topic = contract_topic(app, settings, "dead-letters")
        self.clock = clock or SystemClock()
        self.metrics = metrics if metrics is not None else WorkerMetrics()
        self.retry_max_s = settings.retry_max_backoff_s
        self.sent = 0

    async def send_all(self, bad: list[tuple[Any, str, ContractError]]) -> None:
        """Send in order and wait until the broker has them all (what it refused is sent again while it is
        away): the intake moves its read positions past bad messages only once their dead letters are stored,
        and each is counted then."""
        now = self.clock.now()
        pending = []
        for message, source, exc in bad:
            record = dead_letter_record(message, source, exc, now)
            log.debug("dead letter from %s[%s]@%s: %s", source, record["partition"], record["offset"], exc)
            pending.append((source, exc.reason, record["topic"].encode(), encode("dead-letters", record)))
        backoff = Backoff.upto(self.retry_max_s)
        while pending:
            sent = [await self.topic.send(key=key, value=value) for _, _, key, value in pending]  # in order
            outcomes = await asyncio.gather(*(await_delivery(f) for f in sent), return_exceptions=True)
            refused = []
            for item, outcome in zip(pending, outcomes, strict=True):
                if isinstance(outcome, KafkaError):
                    refused.append(item)
                elif isinstance(outcome, BaseException):
                    raise outcome
                else:
                    self.metrics.dead_letters.labels(item[0], item[1]).inc()
                    self.metrics.messages_out.labels("dead-letters").inc()
                    self.sent += 1
            if refused:
                wait = backoff.next()
                (log.warning if backoff.failures == 1 else log.debug)(
                    "%d dead letter(s) not stored (%r); retrying in %.1f s", len(refused),
                    next(o for o in outcomes if isinstance(o, KafkaError)), wait)
                await asyncio.sleep(wait)
            pending = refused
