"""A node-weights tombstone the broker did not acknowledge is sent again by the next eviction tick, until one
is acknowledged, unless its node is back by then (app.streams.eviction).

Before, its failure was only counted (``outcome="dropped"``) and logged: the compacted node-weights topic kept
the evicted node's last weights for ever, and extenders started later read them back.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import faust.topics
import pytest
from aiokafka.errors import KafkaTimeoutError, TopicAuthorizationFailedError

import app.streams.eviction as eviction
from app.clock import ManualClock
from app.config import Settings
from app.contracts import decode, encode
from app.streams.app import create_app
from app.streams.context import context_of
from app.streams.options import WorkerOptions

AFTER_S = 60.0


class Sender:
    """The intake's batch sender (node-features, changelog rows): taken, never failing."""

    def add(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
        pass

    async def ship(self) -> int:
        return 0


class Worker:
    """The worker's components on a manual clock; its eviction tick run by hand, its node-weights sends held
    as futures the test settles (the broker's acknowledgement or its failure)."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        ticks: dict[str, Any] = {}

        def timer(app: faust.App, interval_s: float, name: str) -> Any:
            def register(fun: Any) -> Any:
                ticks[name] = fun
                return fun
            return register

        self.sends: list[tuple[str, bytes | None, asyncio.Future[Any]]] = []  # node, value, acknowledgement

        async def send(topic: faust.topics.Topic, *, key: bytes | None = None, value: bytes | None = None,
                       **_kw: Any) -> asyncio.Future[Any]:
            assert topic.get_topic_name() == self.settings.topic("node-weights")
            assert key is not None
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self.sends.append((key.decode(), value, fut))
            return fut

        monkeypatch.setattr(eviction, "timer", timer)
        monkeypatch.setattr(faust.topics.Topic, "send", send)
        self.settings = Settings(metrics_port=0, models_dir=str(tmp_path / "models"), node_evict_after_s=AFTER_S)
        self.clock = ManualClock(1000.0)
        app = create_app(self.settings, id=f"t-{tmp_path.name}", clock=self.clock,
                         options=dataclasses.replace(WorkerOptions(), datadir=str(tmp_path / "faust")))
        self.ctx = context_of(app)
        self.tick = ticks["evict-silent"]
        self.nodes = self.ctx.handles["node_features"]
        self.nodes.intake.sender = Sender()
        self.nodes.intake._producer = object()  # running: the eviction tick does its work

    def metrics(self, node: str) -> None:
        """A node-metrics snapshot of ``node``, now (the node is heard of, and has state)."""
        snap = {"node": node, "ts": self.clock.now(), "node_class": "gpu", "gpu_model": "Tesla M40",
                "metrics": {"nvidia_smi_utilization_gpu": 0.4}}
        self.nodes.intake.handlers["node-metrics"](decode("node-metrics", encode("node-metrics", snap)), 0)

    def take(self) -> dict[str, asyncio.Future[Any]]:
        """The node-weights sends since the last call: node -> its acknowledgement (every one a tombstone)."""
        sent, self.sends = self.sends, []
        assert all(value is None for _, value, _ in sent)
        assert len({n for n, _, _ in sent}) == len(sent)  # one tombstone per node and tick
        return {n: fut for n, _, fut in sent}

    def failures(self, outcome: str) -> float:
        return self.ctx.metrics.value("rtt_worker_send_failures_total", topic="node-weights", outcome=outcome)


async def test_a_failed_tombstone_is_sent_again_until_acknowledged_unless_its_node_is_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = Worker(tmp_path, monkeypatch)
    for node in ("a", "b", "c"):
        w.metrics(node)
    w.clock.advance(AFTER_S)

    await w.tick()  # all three evicted: their tombstones go out, and the broker is away
    first = w.take()
    assert first.keys() == {"a", "b", "c"} and not w.nodes.store.states
    for fut in first.values():
        fut.set_exception(KafkaTimeoutError())
    await asyncio.sleep(0)
    assert w.failures("retried") == 3 and w.failures("dropped") == 0

    w.clock.advance(1.0)
    w.metrics("b")  # b is back before the next tick: its new values supersede the tombstone
    async with w.ctx.weights_lock:  # a node-weights period is being sent: the tick waits for it ...
        tick = asyncio.create_task(w.tick())
        for _ in range(10):
            await asyncio.sleep(0)
        assert w.take() == {}  # ... nothing sent meanwhile
        w.metrics("c")  # c is back while the tick waits: the period may have sent its value, no tombstone after it
    await tick
    second = w.take()
    assert second.keys() == {"a"}  # only a, still evicted, is sent its tombstone again
    second["a"].set_result(object())  # and this time the broker acknowledges it
    await asyncio.sleep(0)
    assert w.failures("retried") == 3

    w.clock.advance(1.0)
    await w.tick()
    assert w.take() == {}  # acknowledged: not sent again; b and c are held again
    assert {"b", "c"} <= w.nodes.store.states.keys()

    w.clock.advance(AFTER_S)  # b and c go silent again: evicted, and sent their tombstones afresh
    await w.tick()
    third = w.take()
    assert third.keys() == {"b", "c"}
    for fut in third.values():
        fut.set_result(object())
    await asyncio.sleep(0)
    w.clock.advance(1.0)
    await w.tick()
    assert w.take() == {} and w.failures("retried") == 3 and w.failures("dropped") == 0


async def test_a_tombstone_the_broker_refuses_for_good_is_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error sending again cannot cure (app.kafka.batches.permanent) is counted dropped, as the intakes' are."""
    w = Worker(tmp_path, monkeypatch)
    w.metrics("a")
    w.clock.advance(AFTER_S)
    await w.tick()
    w.take()["a"].set_exception(TopicAuthorizationFailedError())
    await asyncio.sleep(0)
    assert w.failures("dropped") == 1 and w.failures("retried") == 0
    w.clock.advance(1.0)
    await w.tick()
    assert w.take() == {}
