"""What the intake and table tests share: a consumer record and aiokafka's record batch, as stand-ins."""

from __future__ import annotations

import dataclasses

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
