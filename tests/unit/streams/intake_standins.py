"""What the intake and table tests share: a consumer record, aiokafka's record batch and a producer that settles
each batch at once, as stand-ins."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace
from typing import Any

C = "u-task-completions"  # task-completions under the tests' topic prefix "u-"


@dataclasses.dataclass
class Record:
    offset: int
    value: bytes
    topic: str = C
    partition: int = 0
    key: bytes | None = b"n1"


class Batch:
    """aiokafka's record batch: takes every record."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes | None, bytes | None]] = []

    def append(self, *, key: bytes | None, value: bytes | None, timestamp: int) -> object:
        self.records.append((key, value))
        return object()

    def record_count(self) -> int:
        return len(self.records)


class Producer:
    """aiokafka's ``create_batch`` / ``send_batch``: each batch settled at once, failed with the next of
    ``failures`` (None: stored). ``log``: what the broker stored, in the order it stored it."""

    def __init__(self, *failures: BaseException | None) -> None:
        self.log: list[tuple[str, bytes | None, bytes | None]] = []
        self.failures: list[BaseException | None] = list(failures)

    def create_batch(self) -> Batch:
        return Batch()

    async def send_batch(self, batch: Batch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        error = self.failures.pop(0) if self.failures else None
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(SimpleNamespace(offset=len(self.log)))
            self.log += [(topic, k, v) for k, v in batch.records]
        return fut

    def topics(self) -> list[str]:
        return [topic for topic, _, _ in self.log]
