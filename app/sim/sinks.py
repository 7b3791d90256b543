"""Where the simulator's messages go: one seam for offline runs (nowhere, memory) and live runs (Kafka).

A sink receives ``(topic, key, value)`` where ``topic`` is a contract name from ``topics/`` (no prefix),
``key`` the message key the contract names, and ``value`` a dict that satisfies the contract. A Kafka sink
only has to encode and produce; the simulator never blocks on it.

>>> s = ListSink()
>>> s.emit("node-metrics", "worker-3", {"node": "worker-3"})
>>> s.count("node-metrics"), s.messages["node-metrics"][0][0]
(1, 'worker-3')
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any, Protocol

NODE_METRICS = "node-metrics"
TASK_COMPLETIONS = "task-completions"


class Sink(Protocol):
    def emit(self, topic: str, key: str, value: dict[str, Any]) -> None:
        """Accept one message; must not block the simulation for long."""
        ...

    def close(self) -> None:
        """Flush and release; called once when the run ends."""
        ...


class NullSink:
    """Drops everything (fastest offline runs)."""

    def emit(self, topic: str, key: str, value: dict[str, Any]) -> None:
        return None

    def close(self) -> None:
        return None


class ListSink:
    """Keeps every message in memory, per topic, as ``(key, value)``; ``topics`` limits what is kept."""

    def __init__(self, topics: Iterable[str] | None = None) -> None:
        self.topics = frozenset(topics) if topics is not None else None
        self.messages: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)

    def emit(self, topic: str, key: str, value: dict[str, Any]) -> None:
        if self.topics is None or topic in self.topics:
            self.messages[topic].append((key, value))

    def count(self, topic: str) -> int:
        return len(self.messages.get(topic, ()))

    def close(self) -> None:
        return None
