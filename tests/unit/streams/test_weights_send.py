"""node-weights and eviction: a node's tombstone stays the last word of its key (app.streams.feedback_weights)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from app.streams.feedback_weights import send_held


async def period_and_eviction(evict_after_yields: int, evict_lock: Any) -> list[tuple[str, str]]:
    """A period sends a, b, c while an eviction drops b and sends its tombstone; the topic's records."""
    lock = asyncio.Lock()
    held = {"a", "b", "c"}
    topic: list[tuple[str, str]] = []

    async def send(v: dict[str, Any]) -> None:
        for _ in range(3):  # the producer yields to the event loop before the message is queued (a full batch)
            await asyncio.sleep(0)
        topic.append((v["node"], "value"))

    async def evict() -> None:
        for _ in range(evict_after_yields):
            await asyncio.sleep(0)
        held.discard("b")  # the eviction's state change is immediate ...
        async with evict_lock if evict_lock is not None else lock:  # ... its tombstone goes out under the lock
            topic.append(("b", "tombstone"))

    values = [{"node": n, "weight": 0.5} for n in ("a", "b", "c")]
    sent, _ = await asyncio.gather(send_held(values, held, send, lock), evict())
    assert sent == sum(1 for _, kind in topic if kind == "value")
    return topic


@pytest.mark.parametrize("evict_after_yields", range(12))
def test_an_evicted_node_ends_with_its_tombstone_whenever_the_eviction_comes(evict_after_yields: int) -> None:
    topic = asyncio.run(period_and_eviction(evict_after_yields, None))
    assert [r for r in topic if r[0] == "b"][-1] == ("b", "tombstone")
    assert ("a", "value") in topic and ("c", "value") in topic  # the nodes still held are all sent


def test_without_the_shared_lock_the_value_can_follow_the_tombstone() -> None:
    """What the lock prevents: b checked while held, evicted while its send yields, queued after the tombstone."""
    lasts = {[r for r in asyncio.run(period_and_eviction(k, contextlib.nullcontext())) if r[0] == "b"][-1]
             for k in range(12)}
    assert ("b", "value") in lasts
