"""A drift retrain-event is part of the same durable step as the detector reset that signalled it.

The period that fires a node × app detector resets it (the drift leaves the detector's statistic), so the
retrain-event must not be lost once that reset is stored: it is staged in the outbox with the closed
trackers, written by the same checkpoint, sent once that checkpoint is stored and cleared once the broker
acknowledged it. A send that fails leaves it staged for the next tick; a checkpoint that fails leaves it
(and the reset) to the next checkpoint; a worker killed in between hands it to the next one through the
changelog, which looks for it in the topic before sending it. Before, the event was sent once after the
checkpoint, and any failure lost it until the drift episode signalled again.

The broker, the changelog and the worker's Kafka reader are stand-ins kept in memory.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RequestTimedOutError,
    TopicAuthorizationFailedError,
)
from faust.exceptions import ProducerSendError

from app.clock import ManualClock
from app.config import Settings
from app.contracts import contract, decode
from app.drift.joinbuffer import JoinBuffer
from app.kafka.batches import partition_for
from app.registry.directory import DirectoryModelStore
from app.streams import feedback_errors, feedback_outbox
from app.streams.app import create_app
from app.streams.feedback_models import ModelCache
from app.streams.feedback_options import FeedbackOptions
from app.streams.feedback_state import FeedbackLoop
from app.streams.metrics import WorkerMetrics
from app.streams.node_table import NodeStore
from app.streams.options import WorkerOptions

APP, NODE, KEY = "gCTF", "gpu-1", "gCTF:gpu"
GOOD_PERIODS = 14  # periods of the model's usual error before the drift (the detector's reference)
PARTITION = partition_for(NODE.encode(), contract("prediction-errors").partitions)


class Broker:
    """Topics in memory; what each send does is set per topic (``mode``)."""

    OK, RAISE, FAIL, STORED_NOT_ACKED = "ok", "raise", "fail", "stored, not acknowledged"
    NOT_REPLICATED = "on the leader, not acknowledged, not readable yet"  # acks=all: replicas behind

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.logs: dict[tuple[str, int], list[Any]] = {}
        self.mode: dict[str, str] = {}
        self.unreadable = False  # the worker's reader cannot reach the broker
        self.held: list[tuple[str, int, bytes, int]] = []  # NOT_REPLICATED records, readable once replicated
        self.sends = 0  # sends handed to the producer or raised

    def log(self, topic: str, partition: int) -> list[Any]:
        return self.logs.setdefault((topic, partition), [])

    def replicate(self) -> None:
        """The in-sync replicas caught up: the held records become readable."""
        for topic, p, value, ms in self.held:
            log = self.log(topic, p)
            log.append(SimpleNamespace(value=value, offset=len(log), timestamp=ms))
        self.held = []

    def values(self, name: str) -> list[dict[str, Any]]:
        topic = Settings(metrics_port=0).topic(name)
        return [orjson.loads(r.value) for (t, _), recs in sorted(self.logs.items()) if t == topic for r in recs]

    def topic(self, _app: Any, settings: Settings, name: str) -> Any:
        broker, topic, partitions = self, settings.topic(name), contract(name).partitions

        class Topic:
            async def send(self, key: bytes, value: bytes) -> asyncio.Future[Any]:
                mode = broker.mode.get(name, Broker.OK)
                broker.sends += 1
                if mode == Broker.RAISE:
                    raise KafkaTimeoutError()
                decode(name, value, strict=True)
                fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                if mode == Broker.FAIL:
                    fut.set_exception(KafkaConnectionError("broker away"))
                    return fut
                p = partition_for(key, partitions)
                if mode == Broker.NOT_REPLICATED:
                    broker.held.append((topic, p, value, int(broker.clock.now() * 1000)))
                    fut.set_exception(RequestTimedOutError())
                    return fut
                log = broker.log(topic, p)
                log.append(SimpleNamespace(value=value, offset=len(log), timestamp=int(broker.clock.now() * 1000)))
                if mode == Broker.STORED_NOT_ACKED:
                    fut.set_exception(RequestTimedOutError())
                else:
                    fut.set_result(SimpleNamespace(topic=topic, partition=p, offset=len(log) - 1))
                return fut

        return Topic()

    def consumer(self, **_kw: Any) -> Any:
        broker = self

        class Consumer:
            def __init__(self) -> None:
                self.pos: dict[Any, int] = {}

            async def start(self) -> None:
                if broker.unreadable:
                    raise KafkaConnectionError("broker away")

            async def stop(self) -> None:
                pass

            async def end_offsets(self, tps: Any) -> dict[Any, int]:
                return {tp: len(broker.log(tp.topic, tp.partition)) for tp in tps}

            async def offsets_for_times(self, query: dict[Any, int]) -> dict[Any, Any]:
                out = {}
                for tp, ms in query.items():
                    hits = [r for r in broker.log(tp.topic, tp.partition) if r.timestamp >= ms]
                    out[tp] = SimpleNamespace(offset=hits[0].offset, timestamp=hits[0].timestamp) if hits else None
                return out

            def assign(self, tps: Any) -> None:
                self.pos = {tp: 0 for tp in tps}

            def seek(self, tp: Any, offset: int) -> None:
                self.pos[tp] = offset

            async def seek_to_beginning(self, *tps: Any) -> None:
                for tp in tps:
                    self.pos[tp] = 0

            async def getmany(self, timeout_ms: int = 0) -> dict[Any, list[Any]]:
                out = {}
                for tp, at in self.pos.items():
                    recs = broker.log(tp.topic, tp.partition)[at:]
                    if recs:
                        out[tp] = recs
                        self.pos[tp] = at + len(recs)
                return out

            def highwater(self, tp: Any) -> int:
                return len(broker.log(tp.topic, tp.partition))

            async def position(self, tp: Any) -> int:
                return self.pos[tp]

        return Consumer()


class Changelog:
    """The feedback table's changelog, compacted: the rows a restarted worker restores."""

    def __init__(self) -> None:
        self.rows: dict[bytes, bytes] = {}
        self.fail = 0  # writes that fail next (broker away)

    async def write(self, rows: Any, **_kw: Any) -> int:
        rows = list(rows)
        if self.fail:
            self.fail -= 1
            raise KafkaConnectionError("broker away")
        for key, value in rows:
            if value is None:
                self.rows.pop(key, None)
            else:
                self.rows[key] = value
        return len(rows)


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> tuple[ManualClock, Broker, Changelog]:
    clock = ManualClock(1000.0)
    broker = Broker(clock)
    monkeypatch.setattr(feedback_errors, "contract_topic", broker.topic)
    monkeypatch.setattr(feedback_outbox, "AIOKafkaConsumer", broker.consumer)
    return clock, broker, Changelog()


def worker(tmp_path: Path, name: str, clock: ManualClock, changelog: Changelog) -> FeedbackLoop:
    settings = Settings(metrics_port=0)
    app = create_app(settings, id=f"t-{name}-{tmp_path.name}", components=[],
                     options=dataclasses.replace(WorkerOptions(), datadir=str(tmp_path / name)), clock=clock)
    loop = FeedbackLoop(settings, FeedbackOptions(), clock,
                        SimpleNamespace(store=NodeStore(10.0, WorkerOptions(), 1.0)),  # type: ignore[arg-type]
                        ModelCache(settings, store=DirectoryModelStore(tmp_path / "models")),
                        JoinBuffer(60.0, clock=clock), changelog)  # type: ignore[arg-type]
    feedback_errors.register_errors(app, loop)
    assert loop.outbox is not None
    loop.outbox.clock = clock
    loop.node_class[NODE] = "gpu"
    loop.partitions[NODE] = PARTITION
    return loop


async def period(loop: FeedbackLoop, clock: ManualClock, actual_ms: float) -> None:
    """One error period of the node: five pairs, then the period timer's tick."""
    for k in range(5):
        loop.tracker(NODE).add(APP, 100.0, actual_ms + k)
    clock.advance(5.0)
    await loop.handles["close_period"]()


async def until_drift(loop: FeedbackLoop, clock: ManualClock) -> None:
    """The periods before the drift, all delivered: the next period at twice the RTT fires the detector."""
    for _ in range(GOOD_PERIODS):
        await period(loop, clock, 100.0)


async def settle(loop: FeedbackLoop) -> None:
    for _ in range(200):
        if not loop._background:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("background work of the loop did not end")


def drift_events(broker: Broker) -> list[dict[str, Any]]:
    return [v for v in broker.values("retrain-events") if v["reason"] == "drift"]


def sent_count(loop: FeedbackLoop) -> float:
    return loop.metrics.value("rtt_worker_retrain_events_total", reason="drift")


@pytest.mark.parametrize("mode", [Broker.RAISE, Broker.FAIL])
def test_a_drift_event_whose_send_fails_is_delivered_at_the_next_tick(
        tmp_path: Path, world: tuple[ManualClock, Broker, Changelog], mode: str) -> None:
    clock, broker, changelog = world
    loop = worker(tmp_path, "a", clock, changelog)

    async def run() -> None:
        await until_drift(loop, clock)
        broker.mode["retrain-events"] = mode  # the send raises, or its acknowledgement is an error
        await period(loop, clock, 200.0)  # the drift: the detector fires and is reset
        assert drift_events(broker) == [] and sent_count(loop) == 0.0
        broker.mode["retrain-events"] = Broker.OK
        clock.advance(feedback_outbox.UNACKED_UNREADABLE_S)  # a failed acknowledgement: not readable for as long
        await loop.checkpoint()  # the checkpoint timer's next tick
        events = drift_events(broker)
        assert [(e["model_key"], e["reason"]) for e in events] == [(KEY, "drift")]
        assert events[0]["cumulative_error"] > events[0]["threshold"]
        assert sent_count(loop) == 1.0
        clock.advance(1.0)
        await loop.checkpoint()
        await period(loop, clock, 100.0)
        assert len(drift_events(broker)) == 1  # delivered once, then cleared

    asyncio.run(run())


def test_a_drift_whose_checkpoint_fails_after_the_reset_is_not_lost(
        tmp_path: Path, world: tuple[ManualClock, Broker, Changelog]) -> None:
    clock, broker, changelog = world
    loop = worker(tmp_path, "a", clock, changelog)

    async def run() -> None:
        await until_drift(loop, clock)
        changelog.fail = 1
        with pytest.raises(KafkaConnectionError):  # the tick fails: logged and counted by its timer
            await period(loop, clock, 200.0)
        assert drift_events(broker) == []
        clock.advance(1.0)
        await loop.checkpoint()  # stored now, the reset and the event together; then sent
        assert [(e["model_key"], e["reason"]) for e in drift_events(broker)] == [(KEY, "drift")]
        assert sent_count(loop) == 1.0

    asyncio.run(run())


def test_a_drift_event_staged_and_never_sent_is_sent_by_the_restarted_worker(
        tmp_path: Path, world: tuple[ManualClock, Broker, Changelog]) -> None:
    """Killed once the checkpoint holding the reset was stored, before the event reached the broker."""
    clock, broker, changelog = world
    first = worker(tmp_path, "a", clock, changelog)

    async def run() -> None:
        await until_drift(first, clock)
        broker.mode["retrain-events"] = Broker.RAISE
        await period(first, clock, 200.0)
        assert drift_events(broker) == []
        # killed here; the next worker restores the partition from the changelog
        broker.mode["retrain-events"] = Broker.OK
        clock.advance(10.0)
        second = worker(tmp_path, "b", clock, changelog)
        second.restore(dict(changelog.rows), {PARTITION})
        await settle(second)
        assert [(e["model_key"], e["reason"]) for e in drift_events(broker)] == [(KEY, "drift")]
        assert sent_count(second) == 1.0
        await second.checkpoint()
        assert len(drift_events(broker)) == 1
        errors = [(v["node"], v["ts"]) for v in broker.values("prediction-errors")]
        assert len(errors) == len(set(errors)) == GOOD_PERIODS + 1

    asyncio.run(run())


@pytest.mark.parametrize("mode", [Broker.OK, Broker.STORED_NOT_ACKED])
def test_a_drift_event_the_broker_stored_is_found_by_the_restarted_worker_not_sent_again(
        tmp_path: Path, world: tuple[ManualClock, Broker, Changelog], mode: str) -> None:
    """Killed after the broker stored the event (acknowledged, or its acknowledgement lost) and before the
    event left the changelog: the next worker finds it in the topic and does not send it again."""
    clock, broker, changelog = world
    first = worker(tmp_path, "a", clock, changelog)

    async def run() -> None:
        await until_drift(first, clock)
        broker.mode["retrain-events"] = mode
        await period(first, clock, 200.0)
        assert len(drift_events(broker)) == 1
        # killed here, before the checkpoint that would have cleared it from the changelog
        broker.mode["retrain-events"] = Broker.OK
        clock.advance(10.0)
        second = worker(tmp_path, "b", clock, changelog)
        second.restore(dict(changelog.rows), {PARTITION})
        await settle(second)
        await second.checkpoint()
        assert len(drift_events(broker)) == 1
        assert sent_count(second) == 0.0

    asyncio.run(run())


# -- a message sent and not acknowledged is looked for in its topic before it is sent again

def messages(broker: Broker, topic: str) -> list[tuple[Any, ...]]:
    if topic == "retrain-events":
        return [(v["model_key"], v["ts"]) for v in drift_events(broker)]
    return [(v["node"], v["ts"]) for v in broker.values(topic)]


def counted(loop: FeedbackLoop, topic: str) -> float:
    return loop.metrics.value("rtt_worker_messages_out_total", topic=topic)


async def period_of(topic: str, loop: FeedbackLoop, clock: ManualClock, broker: Broker, mode: str) -> None:
    """The period whose ``topic`` message is sent in ``mode``: the drift's for retrain-events."""
    if topic == "retrain-events":
        await until_drift(loop, clock)
    before = counted(loop, topic)
    broker.mode[topic] = mode
    await period(loop, clock, 200.0 if topic == "retrain-events" else 100.0)
    assert counted(loop, topic) == before  # not acknowledged
    broker.mode[topic] = Broker.OK


@pytest.mark.parametrize("topic", ["prediction-errors", "retrain-events"])
def test_a_message_stored_without_its_acknowledgement_is_not_sent_again(
        tmp_path: Path, world: tuple[ManualClock, Broker, Changelog], topic: str) -> None:
    """The broker stored the message and its acknowledgement was lost (a request timed out): the next
    checkpoint finds it in the topic, counts it and clears it instead of publishing it twice."""
    clock, broker, changelog = world
    loop = worker(tmp_path, "a", clock, changelog)

    async def run() -> None:
        await period_of(topic, loop, clock, broker, Broker.STORED_NOT_ACKED)
        before = counted(loop, topic)
        clock.advance(1.0)
        await loop.checkpoint()
        await loop.checkpoint()
        sent = messages(broker, topic)
        assert len(sent) == len(set(sent))
        assert counted(loop, topic) == before + 1
        assert loop.outbox is not None and len(loop.outbox) == 0

    asyncio.run(run())


@pytest.mark.parametrize("topic", ["prediction-errors", "retrain-events"])
def test_a_message_not_acknowledged_is_sent_again_only_once_looked_for(
        tmp_path: Path, world: tuple[ManualClock, Broker, Changelog], topic: str) -> None:
    """The broker did not store it: it is sent again, once, after the topic was read; while the topic cannot be
    read it waits (staged) for a later checkpoint."""
    clock, broker, changelog = world
    loop = worker(tmp_path, "a", clock, changelog)

    async def run() -> None:
        await period_of(topic, loop, clock, broker, Broker.FAIL)
        before, sent_before = counted(loop, topic), len(messages(broker, topic))
        broker.unreadable = True
        clock.advance(1.0)
        await loop.checkpoint()  # cannot look for it: not sent yet
        assert len(messages(broker, topic)) == sent_before and counted(loop, topic) == before
        broker.unreadable = False
        clock.advance(1.0)
        await loop.checkpoint()  # not found, but perhaps not readable yet: not sent yet
        assert len(messages(broker, topic)) == sent_before and counted(loop, topic) == before
        clock.advance(feedback_outbox.UNACKED_UNREADABLE_S)
        await loop.checkpoint()
        await loop.checkpoint()
        sent = messages(broker, topic)
        assert len(sent) == len(set(sent)) == sent_before + 1
        assert counted(loop, topic) == before + 1

    asyncio.run(run())


@pytest.mark.parametrize("topic", ["prediction-errors", "retrain-events"])
def test_a_message_on_the_leader_not_readable_yet_is_not_sent_again(
        tmp_path: Path, world: tuple[ManualClock, Broker, Changelog], topic: str) -> None:
    """acks=all: the request timed out with the record on the leader, not yet on the in-sync replicas, so
    not yet readable. A look a second later does not find it; the message waits for a later look (up to
    ``UNACKED_UNREADABLE_S`` after the failure) instead of being sent again, and is found once readable."""
    clock, broker, changelog = world
    loop = worker(tmp_path, "a", clock, changelog)

    async def run() -> None:
        await period_of(topic, loop, clock, broker, Broker.NOT_REPLICATED)
        before, sent_before = counted(loop, topic), len(messages(broker, topic))
        clock.advance(1.0)
        await loop.checkpoint()  # not readable yet: not found, not sent again
        clock.advance(1.0)
        await loop.checkpoint()
        broker.replicate()
        clock.advance(1.0)
        await loop.checkpoint()  # readable now: found, counted, cleared
        await loop.checkpoint()
        sent = messages(broker, topic)
        assert len(sent) == len(set(sent)) == sent_before + 1
        assert counted(loop, topic) == before + 1
        assert loop.outbox is not None and len(loop.outbox) == 0

    asyncio.run(run())


# -- a send that raises (after the producer's request timeout) stops the delivery: the rest wait

def test_a_send_that_raises_leaves_the_rest_staged_for_the_next_checkpoint(
        world: tuple[ManualClock, Broker, Changelog]) -> None:
    """aiokafka's send raises only after waiting up to the request timeout: the outbox stops at the first
    one that raises, and the messages after it are neither sent nor looked for, but sent at the next checkpoint."""
    clock, _broker, _changelog = world
    calls: list[bytes] = []
    raising = True

    async def send(key: bytes, value: bytes) -> Any:
        calls.append(key)
        if raising:
            raise KafkaTimeoutError()
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_result(SimpleNamespace(topic="t", partition=PARTITION, offset=len(calls)))
        return fut

    outbox = feedback_outbox.ErrorsOutbox(Settings(metrics_port=0), send, clock=clock)

    async def run() -> None:
        nonlocal raising
        for i in range(3):
            outbox.stage(PARTITION, {"node": f"gpu-{i}", "ts": 2000.0 + i})
        outbox.written(outbox.take_rows())
        assert await outbox.deliver() == 0
        assert len(calls) == 1  # stopped at the first send that raised
        assert len(outbox) == 3 and all(e.checked and not e.unacked for e in outbox.entries.values())
        raising = False
        assert await outbox.deliver() == 3  # all three, none looked for first
        assert len(outbox) == 0

    asyncio.run(run())


def _wrapped(exc: Exception) -> Exception:
    """What Faust's producer raises for an error of the client's send: ProducerSendError from it."""
    try:
        raise ProducerSendError(f"Error while sending: {exc!r}") from exc
    except ProducerSendError as wrapped:
        return wrapped


@pytest.mark.parametrize("error", [_wrapped(KafkaTimeoutError()), TopicAuthorizationFailedError(),
                                   _wrapped(TopicAuthorizationFailedError())], ids=["waits", "never", "never-faust"])
def test_a_retrain_event_whose_send_raises_does_not_hold_the_prediction_errors_behind_it(
        world: tuple[ManualClock, Broker, Changelog], error: Exception) -> None:
    """A send of retrain-events that raises holds back only the retrain-events after it; one that raises an
    error no retry cures (the topic not ours to write; as the client raises it, or wrapped by Faust) is dropped
    and counted, never sent again."""
    clock, _broker, _changelog = world
    sent: list[bytes] = []
    retrain_calls: list[bytes] = []

    def acked(key: bytes) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_result(SimpleNamespace(topic="t", partition=PARTITION, offset=len(sent)))
        return fut

    async def send(key: bytes, value: bytes) -> Any:
        sent.append(key)
        return acked(key)

    async def send_retrain(key: bytes, value: bytes) -> Any:
        retrain_calls.append(key)
        raise error

    metrics = WorkerMetrics()
    outbox = feedback_outbox.ErrorsOutbox(Settings(metrics_port=0), send, clock=clock, metrics=metrics,
                                          send_retrain=send_retrain)
    event = {"model_key": "gCTF:gpu", "reason": "drift", "cumulative_error": 0.7, "threshold": 0.5,
             "ts": 2000.0, "onset_ts": 1990.0}

    async def run() -> None:
        outbox.stage_retrain(PARTITION, "gpu-0", event)
        outbox.stage_retrain(PARTITION, "gpu-1", {**event, "model_key": "Motioncor2:gpu"})
        for i in range(3):
            outbox.stage(PARTITION, {"node": f"gpu-{i}", "ts": 2000.0 + i})
        outbox.written(outbox.take_rows())
        assert await outbox.deliver() == 3  # the prediction-errors go out
        assert len(sent) == 3
        dropped = metrics.registry.get_sample_value("rtt_worker_send_failures_total",
                                                     {"topic": "retrain-events", "outcome": "dropped"})
        if isinstance(error.__cause__, KafkaTimeoutError):
            assert len(retrain_calls) == 1 and len(outbox) == 2 and not dropped  # the second waits its turn
        else:
            assert len(retrain_calls) == 2 and len(outbox) == 0 and dropped == 2.0

    asyncio.run(run())


def test_a_message_the_broker_refuses_for_good_is_dropped_not_looked_for_and_sent_again(
        world: tuple[ManualClock, Broker, Changelog]) -> None:
    """An acknowledgement that says the broker can never store the message (too large for it, a topic not ours
    to write) ends it: dropped and counted, not looked for and sent again at every checkpoint."""
    clock, _broker, _changelog = world
    calls: list[bytes] = []

    async def send(key: bytes, value: bytes) -> Any:
        calls.append(key)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_exception(MessageSizeTooLargeError())
        return fut

    metrics = WorkerMetrics()
    outbox = feedback_outbox.ErrorsOutbox(Settings(metrics_port=0), send, clock=clock, metrics=metrics)

    async def run() -> None:
        outbox.stage(PARTITION, {"node": "gpu-0", "ts": 2000.0})
        outbox.written(outbox.take_rows())
        assert await outbox.deliver() == 0
        assert len(outbox) == 0 and len(calls) == 1
        assert metrics.registry.get_sample_value("rtt_worker_send_failures_total",
                                                 {"topic": "prediction-errors", "outcome": "dropped"}) == 1.0
        clock.advance(60.0)
        assert await outbox.deliver() == 0 and len(calls) == 1

    asyncio.run(run())
