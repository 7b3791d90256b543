"""Create every topic of ``topics/`` on a broker, idempotently."""

from __future__ import annotations

import dataclasses

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from app.config import Settings
from app.contracts import load_contracts
from app.errors import RttError
from app.kafka.quiet import handled_connect

TOPIC_ALREADY_EXISTS = 36


class TopicError(RttError):
    """A topic could not be created, or exists with another partition count."""


@dataclasses.dataclass(frozen=True)
class TopicResult:
    topic: str
    partitions: int
    cleanup_policy: str
    created: bool


async def ensure_topics(settings: Settings) -> list[TopicResult]:
    """Create each contract's topic (prefixed) if missing; verify partitions of those that exist."""
    contracts = load_contracts()
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap_servers, request_timeout_ms=10_000)
    try:
        with handled_connect():
            await admin.start()
    except KafkaError as exc:
        await admin.close()
        raise TopicError(f"cannot reach Kafka at {settings.bootstrap_servers} (RTT_KAFKA_BOOTSTRAP): {exc}") from None
    try:
        wanted = {settings.topic(c.name): c for c in contracts.values()}
        resp = await admin.create_topics([
            NewTopic(name, c.partitions, c.replication_factor, topic_configs=c.topic_configs())
            for name, c in wanted.items()
        ])
        created: dict[str, bool] = {}
        for topic, code, message in (e[:3] for e in resp.topic_errors):
            if code not in (0, TOPIC_ALREADY_EXISTS):
                raise TopicError(f"creating {topic}: error {code}: {message}")
            created[topic] = code == 0
        described = await admin.describe_topics(list(wanted))
        results = []
        for d in described:
            name, c = d["topic"], wanted[d["topic"]]
            have = len(d["partitions"])
            if have != c.partitions:
                raise TopicError(
                    f"topic {name} has {have} partitions, its contract says {c.partitions}; "
                    "delete it or fix topics/{c.name}.json"
                )
            results.append(TopicResult(name, have, c.cleanup_policy, created.get(name, False)))
        return sorted(results, key=lambda r: r.topic)
    finally:
        await admin.close()
