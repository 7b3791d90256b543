"""The hand-over of the port answered while waiting for Kafka ends a connection it cancels, even as a line arrives.

Python 3.11's ``asyncio.wait_for`` drops a cancel that comes as the awaited read returns: a connection whose client
kept sending header lines read on after the hand-over cancelled it, and the hand-over (the worker's start) waited for
it without end.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from lost_cancel import AnsweredAsCancelled

import app.health as health


def answering() -> list[asyncio.Task[Any]]:
    """The tasks answering a connection taken while waiting."""
    return [t for t in asyncio.all_tasks()
            if t.get_coro().__qualname__.endswith("answer_while_waiting.<locals>.answer")]


class TricklingReader:
    """A client that sends its request line, then header lines without end; the hand-over's cancel comes in the
    turn the first header line arrives."""

    def __init__(self) -> None:
        self.lines = 0
        self.cancelling = AnsweredAsCancelled(b"X-Slow: 1\r\n")

    async def readline(self) -> bytes:
        self.lines += 1
        if self.lines == 1:
            return b"GET /readyz HTTP/1.1\r\n"
        if self.lines == 2:
            (self.cancelling.victim,) = answering()
            return await self.cancelling()  # type: ignore[no-any-return]
        await asyncio.sleep(0.02)
        return b"X-Slow: 1\r\n"


class NoWriter:
    def write(self, _data: bytes) -> None:
        return None

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        return None


async def test_a_connection_cancelled_as_a_header_line_arrives_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    reader = TricklingReader()

    async def open_connection(**_kw: Any) -> tuple[TricklingReader, NoWriter]:
        return reader, NoWriter()

    monkeypatch.setattr(health.asyncio, "open_connection", open_connection)
    monkeypatch.setattr(health, "HAND_OVER_S", 0.5)  # the hand-over cancels it again then: the test ends anyway
    listening = socket.create_server(("127.0.0.1", 0))
    client = socket.socket()
    try:
        async with health.answer_while_waiting(listening, lambda: "kafka: waiting"):
            client.connect(listening.getsockname())
            for _ in range(100):
                await asyncio.sleep(0.01)
                if reader.cancelling.calls:
                    break
            assert reader.cancelling.calls == 1
            tasks = answering()
            if tasks:
                await asyncio.wait(tasks, timeout=1.0)
            assert all(t.done() for t in tasks), f"the connection read on after its cancel: {reader.lines} lines"
    finally:
        client.close()
        listening.close()
