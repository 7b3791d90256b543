"""A redis-server of the test's own, for the tests that change its configuration: the fixtures :func:`server` and
:func:`locked` (one that asks for :data:`PASSWORD`; a test module imports them and names them in its ``__all__``, as
it does ``test_trainer``'s ``updates``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_stack import RedisServer

PASSWORD = "s3cr3t-pw"  # noqa: S105 - the test server's own


@contextlib.contextmanager
def running(tmp_path: Path, password: str = "") -> Iterator[RedisServer]:
    """A redis-server of the test's own that keeps nothing on disk (asking for ``password``), stopped whatever the
    test did."""
    s = RedisServer(tmp_path, persist=False, password=password).start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with running(tmp_path) as s:
        yield s


@pytest.fixture
def locked(tmp_path: Path) -> Iterator[RedisServer]:
    """One that asks for :data:`PASSWORD`."""
    with running(tmp_path, PASSWORD) as s:
        yield s
