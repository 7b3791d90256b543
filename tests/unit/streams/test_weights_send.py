"""node-weights and eviction: a node's tombstone stays the last word of its key (app.streams.feedback_weights)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError
from prometheus_client import CollectorRegistry, Counter

from app.streams.feedback_weights import send_held
from app.streams.topics import track_delivery


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


async def test_a_node_weights_message_is_counted_sent_once_acknowledged_and_its_loss_is_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    """Nobody waits for a node-weights send (the next period sends the node's value again): it used to be
    counted sent as soon as Faust took it, and its failure was logged at DEBUG only."""
    registry = CollectorRegistry()
    out = Counter("out_total", "sent", registry=registry)
    lost = Counter("lost_total", "not delivered", registry=registry)
    loop = asyncio.get_running_loop()
    stored, failed = loop.create_future(), loop.create_future()
    with caplog.at_level(logging.WARNING, logger="app.streams.topics"):
        track_delivery(stored, "node-weights of a", delivered=out, failed=lost)
        track_delivery(failed, "node-weights of b", delivered=out, failed=lost)
        assert registry.get_sample_value("out_total") == 0  # handed over, not yet acknowledged
        stored.set_result(object())
        failed.set_exception(KafkaTimeoutError())
        await asyncio.sleep(0)
    assert registry.get_sample_value("out_total") == 1 and registry.get_sample_value("lost_total") == 1
    assert [r.getMessage() for r in caplog.records] == ["not delivered: node-weights of b: KafkaTimeoutError()"]
