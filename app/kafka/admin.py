"""Create every topic of ``topics/`` on a broker, idempotently."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from app.config import Settings
from app.contracts import load_contracts
from app.errors import RttError
from app.kafka.client import client_options
from app.kafka.quiet import handled_connect

TOPIC_ALREADY_EXISTS = 36


class TopicError(RttError):
    """A topic could not be created, or exists with another partition count."""


@dataclasses.dataclass(frozen=True)
class InternalTopic:
    """A topic a process needs that is not a contract (a worker group's changelogs and ownership topic)."""

    name: str
    partitions: int
    compacted: bool = False

    def configs(self) -> dict[str, str]:
        return {"cleanup.policy": "compact" if self.compacted else "delete"}


@dataclasses.dataclass(frozen=True)
class TopicResult:
    topic: str
    partitions: int
    cleanup_policy: str
    created: bool


async def started_admin(settings: Settings) -> AIOKafkaAdminClient:
    """A started admin client on the configured broker (the caller closes it); :class:`TopicError` naming
    ``RTT_KAFKA_BOOTSTRAP`` when the broker does not answer."""
    admin = AIOKafkaAdminClient(**client_options(settings, request_timeout_ms=10_000))
    try:
        with handled_connect():
            await admin.start()
    except KafkaError as exc:
        await admin.close()
        raise TopicError(f"cannot reach Kafka at {settings.bootstrap_servers} (RTT_KAFKA_BOOTSTRAP): {exc}") from None
    return admin


async def check_reachable(settings: Settings) -> None:
    """Raise :class:`TopicError` ("cannot reach Kafka at …") unless the broker answers: a process that needs
    it from its first step says so in one line instead of failing deep inside its client."""
    admin = await started_admin(settings)
    await admin.close()


async def ensure_topics(settings: Settings, internal: Sequence[InternalTopic] = ()) -> list[TopicResult]:
    """Create each contract's topic (prefixed), and ``internal`` ones, if missing; verify partitions of those
    that exist."""
    contracts = load_contracts()
    admin = await started_admin(settings)
    try:
        wanted: dict[str, tuple[int, str, NewTopic]] = {}
        for c in contracts.values():
            name = settings.topic(c.name)
            wanted[name] = (c.partitions, c.cleanup_policy,
                            NewTopic(name, c.partitions, settings.replicas(c.replication_factor),
                                     topic_configs=c.topic_configs()))
        for t in internal:
            wanted[t.name] = (t.partitions, t.configs()["cleanup.policy"],
                              NewTopic(t.name, t.partitions, settings.replicas(), topic_configs=t.configs()))
        resp = await admin.create_topics([new for _, _, new in wanted.values()])
        created: dict[str, bool] = {}
        for topic, code, message in (e[:3] for e in resp.topic_errors):
            if code not in (0, TOPIC_ALREADY_EXISTS):
                raise TopicError(f"creating {topic}: error {code}: {message}")
            created[topic] = code == 0
        described = await admin.describe_topics(list(wanted))
        results = []
        for d in described:
            name = d["topic"]
            partitions, cleanup, _ = wanted[name]
            have = len(d["partitions"])
            if have != partitions:
                raise TopicError(f"topic {name} has {have} partitions, {partitions} expected (topics/ or the"
                                 " worker's partition count); delete it and create it again")
            results.append(TopicResult(name, have, cleanup, created.get(name, False)))
        return sorted(results, key=lambda r: r.topic)
    finally:
        await admin.close()
