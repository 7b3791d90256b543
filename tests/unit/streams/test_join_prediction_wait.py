"""An ``ok`` completion read before its prediction waits for it (``RTT_JOIN_PREDICTION_WAIT_S``) before its training
sample is made: the prediction makes the sample with ``predicted_rtt_ms``; at the deadline the sample goes out
without it, counted in ``rtt_worker_training_samples_without_prediction_total``; one sample per completion whatever
the order, across a restart from the changelog too. Before, the sample was made at once without the prediction."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from intake_standins import Producer

from app.clock import ManualClock
from app.config import Settings
from app.contracts import decode, encode
from app.drift.joinbuffer import JoinBuffer
from app.errors import ConfigError
from app.extender.predictions import prediction_value
from app.kafka.batches import BatchSender
from app.registry.directory import DirectoryModelStore
from app.streams.app import create_app
from app.streams.feedback_join import register_join
from app.streams.feedback_models import ModelCache
from app.streams.feedback_options import FeedbackOptions
from app.streams.feedback_state import FeedbackLoop
from app.streams.intake import PartitionIntake
from app.streams.node_table import NodeStore
from app.streams.options import WorkerOptions

S = Settings.from_env({"RTT_METRICS_PORT": "0"}, topic_prefix="u-")
SAMPLES = S.topic("training-samples")
KEY = ("t1", "gpu-1")


@dataclasses.dataclass
class Join:
    loop: FeedbackLoop
    intake: PartitionIntake
    producer: Producer

    def on(self, topic: str, value: dict[str, Any]) -> None:
        self.intake.handlers[topic](decode(topic, encode(topic, value)), 0)

    def scrape(self, node: str = "gpu-1") -> None:
        state = self.loop.nodes.store.state(node, 0, lambda _: None)
        state.update({"node": node, "ts": 990.0, "node_class": "gpu", "gpu_model": "Tesla M40",
                      "metrics": {"gpu_util": 50.0}}, 0)

    def tick(self) -> None:
        """One pass of the held-samples timer."""
        self.loop.handles["retry_held"]()

    def samples(self) -> list[dict[str, Any]]:
        assert self.intake.sender is not None
        asyncio.run(self.intake.sender.flush())
        return [decode("training-samples", v) for t, _, v in self.producer.log if t == SAMPLES]

    def without(self) -> float:
        return self.loop.metrics.feedback.samples_without_prediction._value.get()

    def held_gauge(self) -> float:
        return next(s.value for m in self.loop.metrics.feedback.samples_held.collect() for s in m.samples)


def make_join(tmp_path: Path, clock: ManualClock, wait_s: float = 5.0, buffer: JoinBuffer | None = None,
              name: str = "a") -> Join:
    app = create_app(S, id=f"t-{tmp_path.name}-{name}", components=[],
                     options=dataclasses.replace(WorkerOptions(), datadir=str(tmp_path / name)), clock=clock)
    nodes = SimpleNamespace(store=NodeStore(10.0, WorkerOptions(), 1.0), table=SimpleNamespace(data={}))
    loop = FeedbackLoop(S, FeedbackOptions(join_prediction_wait_s=wait_s), clock, nodes,  # type: ignore[arg-type]
                        ModelCache(S, store=DirectoryModelStore(tmp_path / "models")),
                        buffer if buffer is not None else JoinBuffer(600.0, clock=clock), None)  # type: ignore[arg-type]
    intake = register_join(app, loop)
    producer = Producer()
    intake.sender = BatchSender(producer, on_delivered=intake._delivered,  # type: ignore[arg-type]
                                on_failed=intake._failed)
    return Join(loop, intake, producer)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1000.0)


@pytest.fixture
def join(tmp_path: Path, clock: ManualClock) -> Join:
    j = make_join(tmp_path, clock)
    j.scrape()
    return j


def completion(status: str = "ok") -> dict[str, Any]:
    return {"task_id": "t1", "app": "gCTF", "node": "gpu-1", "submitted_ts": 994.0, "started_ts": 995.0,
            "finished_ts": 997.0, "rtt_ms": 2000.0, "status": status}


def prediction() -> dict[str, Any]:
    return prediction_value("t1", "gCTF", "gpu-1", 994.5, 1800.0, 3, "gCTF:gpu", {"running_pods_gCTF": 2.0})


def test_a_prediction_read_after_its_completion_makes_the_sample_with_it(join: Join, clock: ManualClock) -> None:
    join.on("task-completions", completion())
    assert join.samples() == [] and KEY in join.loop.buffer.held_keys
    assert join.held_gauge() == 0  # waiting for a prediction is not waiting for the node's class
    clock.advance(0.3)
    join.on("rtt-predictions", prediction())
    (sample,) = join.samples()
    assert sample["predicted_rtt_ms"] == 1800.0 and sample["model_version"] == 3
    assert sample["features"]["running_pods_gCTF"] == 2.0
    assert not join.loop.buffer.held_keys and join.without() == 0
    clock.advance(10.0)
    join.tick()
    assert len(join.samples()) == 1  # the deadline passing later makes no second sample


def test_at_the_deadline_the_sample_goes_out_without_the_prediction_once(join: Join, clock: ManualClock) -> None:
    join.on("task-completions", completion())
    clock.advance(4.9)
    join.tick()
    assert join.samples() == []  # still within RTT_JOIN_PREDICTION_WAIT_S
    clock.advance(0.1)  # exactly at the deadline
    join.tick()
    (sample,) = join.samples()
    assert sample["predicted_rtt_ms"] is None and join.without() == 1
    join.on("rtt-predictions", prediction())  # the late prediction: a pair, no second sample
    assert len(join.samples()) == 1 and join.without() == 1
    assert join.loop.metrics.feedback.join.labels("matched")._value.get() == 1


def test_a_prediction_read_at_the_deadline_before_the_timer_makes_one_sample(join: Join, clock: ManualClock) -> None:
    join.on("task-completions", completion())
    clock.advance(5.0)
    join.on("rtt-predictions", prediction())
    join.tick()
    (sample,) = join.samples()
    assert sample["predicted_rtt_ms"] == 1800.0 and join.without() == 0


@pytest.mark.parametrize("late_s", [1.0, 8.0])
def test_a_held_completion_survives_a_restart_from_the_changelog(tmp_path: Path, clock: ManualClock,
                                                                late_s: float) -> None:
    first = make_join(tmp_path, clock)
    first.scrape()
    first.on("task-completions", completion())
    upserts, _ = first.loop.buffer.take_changes()  # what the checkpoint writes to the changelog
    rows = {k: orjson.loads(orjson.dumps(v)) for k, v in upserts.items()}
    assert first.samples() == []
    restored = JoinBuffer(600.0, clock=clock)
    restored.load(rows)
    second = make_join(tmp_path, clock, buffer=restored, name="b")
    second.scrape()
    clock.advance(late_s)
    second.tick()
    if late_s < 5.0:  # its deadline kept: still waiting, and the prediction makes the sample
        assert second.samples() == []
        second.on("rtt-predictions", prediction())
        assert [s["predicted_rtt_ms"] for s in second.samples()] == [1800.0]
    else:  # past its deadline: the first pass sends it without the prediction
        assert [s["predicted_rtt_ms"] for s in second.samples()] == [None]
        second.on("rtt-predictions", prediction())
        assert len(second.samples()) == 1
    second.tick()
    assert len(second.samples()) == 1 and not second.loop.buffer.held_keys


def test_past_the_deadline_a_completion_of_an_unknown_node_waits_for_its_class(tmp_path: Path,
                                                                              clock: ManualClock) -> None:
    join = make_join(tmp_path, clock)  # no scrape: the node's class unknown
    join.on("task-completions", completion())
    clock.advance(6.0)
    join.tick()
    assert join.samples() == [] and KEY in join.loop.buffer.held_keys and join.held_gauge() == 1
    join.scrape()
    join.tick()
    (sample,) = join.samples()
    assert sample["predicted_rtt_ms"] is None and join.without() == 1 and join.held_gauge() == 0


def test_no_wait_makes_the_sample_at_once_and_counts_it(tmp_path: Path, clock: ManualClock) -> None:
    join = make_join(tmp_path, clock, wait_s=0.0)
    join.scrape()
    join.on("task-completions", completion())
    (sample,) = join.samples()
    assert sample["predicted_rtt_ms"] is None and join.without() == 1 and not join.loop.buffer.held_keys


def test_a_failed_completion_is_not_held(join: Join) -> None:
    join.on("task-completions", completion("failed"))
    assert join.samples() == [] and not join.loop.buffer.held_keys


def unknown_node(join: Join) -> float:
    return join.loop.metrics.feedback.samples_dropped.labels("unknown_node")._value.get()


def test_waiting_completions_are_bounded_by_the_join_buffer(tmp_path: Path, clock: ManualClock) -> None:
    """The oldest waiting completion leaves a full buffer, its sample without the prediction: not lost."""
    join = make_join(tmp_path, clock, buffer=JoinBuffer(600.0, max_entries=2, clock=clock))
    join.scrape()
    for task in ("t1", "t2", "t3"):
        join.on("task-completions", {**completion(), "task_id": task})
    join.loop.expire()
    assert len(join.loop.buffer.held_keys) == 2 and len(join.loop.buffer) == 2
    assert [(s["task_id"], s["predicted_rtt_ms"]) for s in join.samples()] == [("t1", None)]
    assert join.without() == 1 and unknown_node(join) == 0
    clock.advance(6.0)
    join.tick()
    assert sorted(s["task_id"] for s in join.samples()) == ["t1", "t2", "t3"] and join.without() == 3


def test_a_restored_waiting_completion_past_its_ttl_makes_its_sample(tmp_path: Path, clock: ManualClock) -> None:
    """A worker down longer than RTT_JOIN_TTL_S: the checkpoint's expire, before the timer, sends the sample."""
    first = make_join(tmp_path, clock)
    first.scrape()
    first.on("task-completions", completion())
    upserts, _ = first.loop.buffer.take_changes()
    rows = {k: orjson.loads(orjson.dumps(v)) for k, v in upserts.items()}
    clock.advance(700.0)
    restored = JoinBuffer(600.0, clock=clock)
    restored.load(rows)
    second = make_join(tmp_path, clock, buffer=restored, name="b")
    second.scrape()
    second.loop.expire()
    assert [(s["task_id"], s["predicted_rtt_ms"]) for s in second.samples()] == [("t1", None)]
    assert unknown_node(second) == 0 and second.without() == 1
    second.tick()
    assert len(second.samples()) == 1


def test_a_leaving_completion_waiting_for_its_node_class_makes_none(tmp_path: Path, clock: ManualClock) -> None:
    """Past its deadline, waiting for its node's class only: it leaves as unknown_node, with no sample."""
    join = make_join(tmp_path, clock, buffer=JoinBuffer(10.0, clock=clock))  # no scrape: the node's class unknown
    join.on("task-completions", completion())
    clock.advance(6.0)
    join.tick()
    clock.advance(5.0)
    join.loop.expire()
    assert join.samples() == [] and unknown_node(join) == 1 and join.without() == 0


def test_a_waiting_completion_leaving_before_its_deadline_with_an_unknown_node_is_unknown_node(
        tmp_path: Path, clock: ManualClock) -> None:
    join = make_join(tmp_path, clock, buffer=JoinBuffer(600.0, max_entries=1, clock=clock))  # no scrape
    for task in ("t1", "t2"):
        join.on("task-completions", {**completion(), "task_id": task})
    join.loop.expire()
    assert join.samples() == [] and unknown_node(join) == 1


def test_none_leaves_while_no_sender_is_up_and_it_goes_out_once_one_is(tmp_path: Path, clock: ManualClock) -> None:
    join = make_join(tmp_path, clock, buffer=JoinBuffer(600.0, max_entries=1, clock=clock))
    join.scrape()
    for task in ("t1", "t2"):
        join.on("task-completions", {**completion(), "task_id": task})
    join.loop.buffer.take_changes()
    sender, join.intake.sender = join.intake.sender, None  # the intake stopped (or not started yet)
    assert join.loop.expire() is False
    join.tick()  # no sender: nothing sent, nothing dropped, nothing left the join
    assert unknown_node(join) == 0 and len(join.loop.buffer.held_keys) == 2
    assert join.loop.buffer.take_changes() == ({}, set())  # no removal for a checkpoint to store
    join.intake.sender = sender
    assert join.loop.expire() is True
    assert [(s["task_id"], s["predicted_rtt_ms"]) for s in join.samples()] == [("t1", None)]
    assert unknown_node(join) == 0 and join.without() == 1


def test_a_sample_due_at_expiry_with_no_sender_up_survives_a_crash_after_the_checkpoint(
        tmp_path: Path, clock: ManualClock) -> None:
    """A held completion whose entry is past RTT_JOIN_TTL_S while the intake's sender is not up: the checkpoint
    must not store its removal while its sample lives only in memory; a crash right after loses nothing."""
    first = make_join(tmp_path, clock, buffer=JoinBuffer(10.0, clock=clock))
    first.scrape()
    first.on("task-completions", completion())
    upserts, _ = first.loop.buffer.take_changes()  # checkpoint 1: the held entry stored
    rows = {k: orjson.loads(orjson.dumps(v)) for k, v in upserts.items()}
    first.intake.sender = None  # the intake's producer not up (stopped, or not started yet)
    clock.advance(11.0)  # past RTT_JOIN_TTL_S
    first.loop.expire()  # what the next checkpoint does first ...
    _, removed = first.loop.buffer.take_changes()  # ... before it stores the changes
    for k in removed:
        rows.pop(k, None)
    restored = JoinBuffer(10.0, clock=clock)  # crash: a new worker from the stored rows
    restored.load(rows)
    second = make_join(tmp_path, clock, buffer=restored, name="b")
    second.scrape()
    second.tick()
    second.loop.expire()
    assert [(s["task_id"], s["predicted_rtt_ms"]) for s in second.samples()] == [("t1", None)]


@pytest.mark.parametrize(("env", "message"), [
    ({"RTT_JOIN_PREDICTION_WAIT_S": "-1"}, "RTT_JOIN_PREDICTION_WAIT_S: must be >= 0 (got -1.0)"),
    ({"RTT_JOIN_PREDICTION_WAIT_S": "inf"}, "RTT_JOIN_PREDICTION_WAIT_S: must be finite (got inf)"),
    ({"RTT_JOIN_PREDICTION_WAIT_S": "soon"}, "RTT_JOIN_PREDICTION_WAIT_S"),
    ({"RTT_JOIN_PREDICTION_WAIT_S": "60", "RTT_JOIN_TTL_S": "60"},
     "RTT_JOIN_PREDICTION_WAIT_S: must be < RTT_JOIN_TTL_S (60) (got 60)"),
])
def test_a_bad_wait_fails_at_start_naming_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env(env)
    assert str(info.value).startswith(message)


def test_the_wait_is_read_from_its_variable() -> None:
    settings = Settings.from_env({"RTT_JOIN_PREDICTION_WAIT_S": "2.5"})
    assert FeedbackOptions.from_settings(settings).join_prediction_wait_s == 2.5
    assert Settings().join_prediction_wait_s == 5.0
