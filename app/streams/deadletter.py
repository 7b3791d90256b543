"""Dead letters: a message that fails decoding or its contract is recorded, counted and skipped.

Every intake (:class:`~app.streams.intake.PartitionIntake`) hands the messages it cannot decode or check, and
those its handlers refuse (a cap), to its own sender with the batch's other outputs (:meth:`DeadLetters.stage`),
in the step that applies the batch: the dead-letters topic (contract ``topics/dead-letters.json``) gets its
source topic, partition, offset, error, stable ``reason``, raw bytes (base64), key and time, and
``rtt_worker_dead_letters_total{topic, reason}`` counts it once the broker has it (:meth:`DeadLetters.stored`).
The sender sends it until the broker has it, and a checkpoint flushes the sender before it writes the read
positions past it. An intake not started (no sender) waits for them instead (:meth:`DeadLetters.send_all`).

What the worker makes but may not send -- a training sample that breaks its contract -- has a dead letter too
(:class:`Unsent`: source the contract it breaks, offset -1), handed to the intake's sender the same way
(:meth:`~app.streams.intake.PartitionIntake.refuse`).

A dead letter is bounded (:func:`app.contracts.dead.dead_letter_value`: the raw payload's first 64 KiB, the
key's first 256 characters, cuts said in ``error``). One the broker refuses for good all the same — too large
for it, the topic invalid or not ours to write (:func:`app.kafka.batches.permanent`) — is dropped: one ERROR
line, counted in ``rtt_worker_send_failures_total{topic="dead-letters", outcome="dropped"}``, and the intake
goes on (sending it again would stall the intake for ever). One refused for a while (a broker away) is sent
again until stored, counted there with ``outcome="retried"``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, NamedTuple

import faust
from aiokafka.errors import KafkaError

from app.clock import Clock, SystemClock
from app.config import Settings
from app.contracts import contract, encode
from app.contracts.dead import dead_letter_record
from app.errors import ContractError
from app.kafka.batches import BatchSender, partition_for, permanent
from app.retry import Backoff
from app.streams.metrics import WorkerMetrics
from app.streams.topics import await_delivery, contract_topic

log = logging.getLogger(__name__)

TOPIC = "dead-letters"
Bad = tuple[Any, str, ContractError]  # (message, source contract, why)


class Unsent(NamedTuple):
    """A record the worker made but does not send, as its dead letter names it: the topic and partition it was meant
    for, offset -1 (it never was on Kafka, as the bridge names a record it refuses to send)."""

    topic: str
    partition: int
    key: bytes
    value: bytes
    offset: int = -1


class Letter(NamedTuple):
    """One encoded dead letter, with what names it in logs and metrics."""

    source: str  # the source contract (the metric label)
    reason: str
    where: str  # topic[partition]@offset of the message
    key: bytes
    value: bytes


def letters(bad: Iterable[Bad], now: float) -> list[Letter]:
    """The dead letters of ``bad``, in order."""
    out = []
    for message, source, exc in bad:
        record = dead_letter_record(message, source, exc, now)
        where = f"{record['topic']}[{record['partition']}]@{record['offset']}"
        log.debug("dead letter from %s: %s", where, exc)
        out.append(Letter(source, exc.reason, where, record["topic"].encode(), encode(TOPIC, record)))
    return out


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The broker's or client's error behind ``exc`` (Faust wraps one a send raises at once), else None."""
    for e in (exc, exc.__cause__):
        if isinstance(e, KafkaError):
            return e
    return None


async def _outcome(sent: Any) -> BaseException | None:
    """None once ``sent`` (what a send returned, or the error it raised) is stored, else the error."""
    if isinstance(sent, BaseException):
        return sent
    try:
        await await_delivery(sent)
    except Exception as exc:
        return exc
    return None


class DeadLetters:
    """Sends dead letters for one app to ``settings.topic("dead-letters")``, counted in ``metrics``."""

    def __init__(self, app: faust.App, settings: Settings, clock: Clock | None = None,
                 metrics: WorkerMetrics | None = None) -> None:
        self.topic = contract_topic(app, settings, TOPIC)
        self.topic_name = settings.topic(TOPIC)
        self.partitions = contract(TOPIC).partitions
        self.clock = clock or SystemClock()
        self.metrics = metrics if metrics is not None else WorkerMetrics()
        self.retry_max_s = settings.retry_max_backoff_s
        self.sent = 0

    def stored(self, source: str, reason: str) -> None:
        """Count one dead letter the broker has stored."""
        self.metrics.dead_letters.labels(source, reason).inc()
        self.metrics.messages_out.labels(TOPIC).inc()
        self.sent += 1

    def stage(self, sender: BatchSender, bad: list[Bad]) -> list[tuple[str, str, int]]:
        """Hand the dead letters of ``bad`` to ``sender`` (an intake's), in order, without waiting; their
        ``(source, reason, size)`` (key and value bytes): the intake passes ``source`` and ``reason`` to
        :meth:`stored` as the sender reports them delivered, and bounds what it holds by their sizes.

        The sender sends them until delivered, or drops one refused for good (logged, and counted with
        ``outcome="dropped"``), like the intake's other outputs; a checkpoint flushes it before it writes the
        read positions, so those never pass a message whose dead letter the broker does not have. A worker that
        stops before that checkpoint is stored reads the messages again and stages their dead letters again.
        """
        out = []
        for letter in letters(bad, self.clock.now()):
            sender.add(self.topic_name, partition_for(letter.key, self.partitions), letter.key, letter.value)
            out.append((letter.source, letter.reason, len(letter.key) + len(letter.value)))
        return out

    async def send_all(self, bad: list[Bad]) -> None:
        """Send in order and wait until the broker has them all: what it refused for a while is sent again
        until it takes it, what it refuses for good is dropped (logged at ERROR, naming the message, counted);
        each is counted when stored. What an intake not started (no sender) does before its read positions
        move past ``bad``.

        Raises an error that is not the broker's or the client's.
        """
        pending = letters(bad, self.clock.now())
        failures = self.metrics.send_failures
        backoff = Backoff.upto(self.retry_max_s)
        while pending:
            sent: list[Any] = []
            for letter in pending:  # in order
                try:
                    sent.append(await self.topic.send(key=letter.key, value=letter.value))
                except Exception as exc:  # refused before it left (Faust wraps the client's error)
                    sent.append(exc)
            outcomes = await asyncio.gather(*(_outcome(s) for s in sent))
            refused: list[Letter] = []
            error: KafkaError | None = None
            for letter, outcome in zip(pending, outcomes, strict=True):
                if outcome is None:
                    self.stored(letter.source, letter.reason)
                    continue
                why = kafka_error(outcome)
                if why is None:
                    raise outcome
                if permanent(why):
                    failures.labels(TOPIC, "dropped").inc()
                    log.error("dead letter of %s (%s, %d bytes) refused for good (%r): dropped", letter.where,
                              letter.reason, len(letter.value), why)
                else:
                    failures.labels(TOPIC, "retried").inc()
                    refused.append(letter)
                    error = error or why
            if refused:
                wait = backoff.next()
                (log.warning if backoff.failures == 1 else log.debug)(
                    "%d dead letter(s) not stored (%r); retrying in %.1f s", len(refused), error, wait)
                await asyncio.sleep(wait)
            pending = refused
