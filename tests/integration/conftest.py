"""Fixtures of the integration tests that run ``rttsched`` as a child on an embedded broker of their own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.kafka.embedded import EmbeddedBroker


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    """An embedded broker of the test's own, stopped whatever the test did (it may stop and start it)."""
    with EmbeddedBroker() as b:
        yield b
