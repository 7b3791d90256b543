"""Producing the bridge's messages: node-metrics, task-completions and dead-letters.

Every value is encoded through :func:`app.contracts.encode`, so a message that breaks its topic contract
raises :class:`~app.errors.ContractError` before anything is sent. Messages are keyed by node (the
contracts' key), so one node's messages stay in order on one partition; dead-letters are keyed by the
topic the bad record was meant for.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from app.bridge.errors import BridgeError
from app.bridge.metrics import BridgeMetrics
from app.config import Settings
from app.contracts import encode
from app.contracts.dead import dead_letter_value
from app.kafka.batches import permanent
from app.kafka.client import client_options
from app.kafka.quiet import handled_connect

KEY_FIELD = {"node-metrics": "node", "task-completions": "node"}
STOP_S = 5.0  # a producer's stop (what it holds delivered, connections closed) waits at most this long

log = logging.getLogger(__name__)


async def start_producer(settings: Settings, *, client_id: str = "rttsched-bridge") -> AIOKafkaProducer:
    """A started producer on the configured broker; the caller stops it."""
    producer = AIOKafkaProducer(**client_options(settings, client_id=client_id, linger_ms=5, request_timeout_ms=10_000))
    try:
        with handled_connect():
            await producer.start()
    except KafkaError as exc:
        await producer.stop()
        raise BridgeError(f"cannot reach Kafka at {settings.bootstrap_servers} (RTT_KAFKA_BOOTSTRAP): {exc}") from None
    return producer


async def stop_producer(producer: AIOKafkaProducer, settings: Settings, timeout_s: float = STOP_S) -> bool:
    """Stop ``producer``: what it holds is delivered first, for at most ``timeout_s`` (a broker away would hold the
    stop for its request timeout or longer); whether it stopped in time. Past it, what was not delivered is lost,
    said in one WARNING."""
    stopping = asyncio.ensure_future(producer.stop())
    done, _ = await asyncio.wait({stopping}, timeout=max(timeout_s, 0.0))
    if stopping in done:
        error = None if stopping.cancelled() else stopping.exception()
        if error is not None:
            log.warning("Kafka producer at %s stopped with an error: %r", settings.bootstrap_servers, error)
        return error is None
    stopping.cancel()
    await asyncio.gather(stopping, return_exceptions=True)
    log.warning("Kafka at %s did not take what the producer still held within %gs: stopped without it, "
                "not delivered", settings.bootstrap_servers, timeout_s)
    return False


Message = tuple[str, bytes, bytes | None]  # topic (prefixed), value, key


def encode_messages(settings: Settings, topic: str, values: Iterable[dict[str, Any]]) -> list[Message]:
    """Encode every value for contract ``topic``, keyed by its node (dead letters: by the topic meant):
    :class:`~app.errors.ContractError` for one that breaks the contract, before any is sent."""
    key_field = KEY_FIELD.get(topic)
    name = settings.topic(topic)
    out: list[Message] = []
    for v in values:
        key = v.get(key_field) if key_field else v.get("topic")
        out.append((name, encode(topic, v), key.encode() if isinstance(key, str) else None))
    return out


async def send_messages(producer: AIOKafkaProducer, messages: Sequence[Message], *,
                        handed: Callable[[Message], None] | None = None) -> list[tuple[Message, BaseException]]:
    """Send ``messages`` and wait for every answer: those the broker did not take, in their order, each with its
    error ([] when it took them all). ``handed``: called with each message once the producer took it to send (its
    ``send()`` returned); one still waiting for room in the producer's buffer when the wait is cut short never
    left the process. A message refused for good before it left (larger than the producer's request size:
    :func:`~app.kafka.batches.permanent`) fails alone, and the others are sent. A send refused before the message
    left for another reason (no metadata, no room in the producer's buffer within its request timeout) leaves that
    message and those after it unsent. A message that failed with a timeout may have been stored all the same."""
    outcomes: list[asyncio.Future[Any] | BaseException] = []
    refused: BaseException | None = None
    for message in messages:
        name, value, key = message
        try:
            outcomes.append(await producer.send(name, value=value, key=key))
            if handed is not None:
                handed(message)
        except (KafkaError, OSError) as exc:  # OSError: TimeoutError too
            if permanent(exc):  # this message only
                outcomes.append(exc)
                continue
            refused = exc
            break
    answers = iter(await asyncio.gather(*(f for f in outcomes if not isinstance(f, BaseException)),
                                        return_exceptions=True))
    results = [f if isinstance(f, BaseException) else next(answers) for f in outcomes]
    failed = [(m, r) for m, r in zip(messages, results, strict=False) if isinstance(r, BaseException)]
    if refused is not None:
        failed.extend((m, refused) for m in messages[len(outcomes):])
    return failed


async def publish(producer: AIOKafkaProducer, settings: Settings, topic: str, values: Iterable[dict[str, Any]],
                  *, metrics: BridgeMetrics | None = None) -> int:
    """Encode every value for contract ``topic`` (all before sending any), send them, wait for the acks; the
    first error of a message the broker did not take is raised."""
    messages = encode_messages(settings, topic, values)
    failed = await send_messages(producer, messages)
    if failed:
        raise failed[0][1]
    if metrics is not None and messages:
        metrics.messages.labels(topic=settings.topic(topic)).inc(len(messages))
    return len(messages)


async def publish_node_metrics(producer: AIOKafkaProducer, settings: Settings, messages: Iterable[dict[str, Any]],
                               *, metrics: BridgeMetrics | None = None) -> int:
    """Send node-metrics messages (one per node scrape); returns how many."""
    return await publish(producer, settings, "node-metrics", messages, metrics=metrics)


def dead_letter(settings: Settings, topic: str, raw: bytes | str, error: str, *, reason: str,
                key: str | None = None, partition: int = -1, offset: int = -1,
                ts: float | None = None) -> dict[str, Any]:
    """A dead-letters value for a record meant for contract ``topic``.

    Records that never were on Kafka (a line of a file) have ``partition`` -1 and their line number as
    ``offset``.

    >>> from app.config import Settings
    >>> d = dead_letter(Settings(), "task-completions", b"{", "invalid_json: ...", reason="invalid_json",
    ...                 offset=3, ts=0.0)
    >>> d["topic"], d["raw"], d["offset"]
    ('task-completions', 'ew==', 3)
    """
    return dead_letter_value(settings.topic(topic), partition, offset, error, reason, raw, key,
                             time.time() if ts is None else ts)
