from __future__ import annotations

import asyncio
import os

import pytest

from app.contracts import load_contracts
from app.kafka.admin import ensure_topics
from app.kafka.embedded import BrokerError, EmbeddedBroker

pytestmark = pytest.mark.integration


def test_embedded_broker_starts_answers_and_stops_without_orphans():
    broker = EmbeddedBroker().start()
    pid = broker.pid
    assert pid is not None
    os.kill(pid, 0)  # alive
    broker.stop()
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


def test_broker_refuses_a_busy_port(kafka_bootstrap):
    host, port = kafka_bootstrap.rsplit(":", 1)
    with pytest.raises(BrokerError, match="already in use"):
        EmbeddedBroker(int(port), host).start()


def test_topic_creation_is_idempotent_and_follows_the_contracts(kafka_settings):
    again = asyncio.run(ensure_topics(kafka_settings))
    assert not any(r.created for r in again)
    contracts = load_contracts()
    for r in again:
        c = contracts[r.topic.removeprefix(kafka_settings.topic_prefix)]
        assert r.partitions == c.partitions
        assert r.cleanup_policy == c.cleanup_policy
