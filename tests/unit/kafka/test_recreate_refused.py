"""A topic the broker will not delete (topic ACLs, ``delete.topic.enable=false``) or create again is an error naming
the broker's code, not three silent tries ending in advice to use the flag that was just used."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.admin import NewTopic

from app.kafka.admin import TopicError, _recreate

WRONG = [(NewTopic("p-node-metrics", 8, 1), "16 partitions, 8 expected")]


class Admin:
    """The admin client's answers: per-topic error codes, as aiokafka hands them over without raising."""

    def __init__(self, delete_code: int = 0, create_code: int = 0) -> None:
        self.delete_code, self.create_code = delete_code, create_code
        self.calls: list[str] = []

    async def delete_topics(self, names: list[str]) -> Any:
        self.calls.append("delete")
        return SimpleNamespace(topic_error_codes=[(n, self.delete_code) for n in names])

    async def list_topics(self) -> list[str]:
        return []

    async def create_topics(self, topics: list[NewTopic]) -> Any:
        self.calls.append("create")
        return SimpleNamespace(topic_errors=[(t.name, self.create_code, "refused") for t in topics])


async def test_a_refused_delete_is_named_with_its_code_and_nothing_is_created() -> None:
    admin = Admin(delete_code=73)  # TOPIC_DELETION_DISABLED
    with pytest.raises(TopicError, match="the broker did not delete p-node-metrics: error 73"):
        await _recreate(admin, WRONG)  # type: ignore[arg-type]
    assert admin.calls == ["delete"]


async def test_a_refused_creation_is_named_with_its_code() -> None:
    admin = Admin(create_code=29)  # TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(TopicError, match="did not create again p-node-metrics: error 29: refused"):
        await _recreate(admin, WRONG)  # type: ignore[arg-type]


async def test_a_topic_deleted_meanwhile_or_created_meanwhile_is_no_error() -> None:
    for admin in (Admin(delete_code=3), Admin(create_code=36)):  # UNKNOWN_TOPIC_OR_PARTITION, TOPIC_ALREADY_EXISTS
        await _recreate(admin, WRONG)  # type: ignore[arg-type]
        assert admin.calls == ["delete", "create"]
