"""A redis-server of the test's own, for the tests that change its configuration: the fixture :func:`server` (a test
module imports it and names it in its ``__all__``, as it does ``test_trainer``'s ``updates``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_stack import RedisServer


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own that keeps nothing on disk, stopped whatever the test did."""
    s = RedisServer(tmp_path, persist=False).start()
    try:
        yield s
    finally:
        s.stop()
