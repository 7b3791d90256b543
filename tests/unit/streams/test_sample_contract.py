"""The join sends no training sample that breaks the training-samples contract: such a sample goes to dead letters
with the contract's reason, and is counted; and the worker's fast check answers as the contract does."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from intake_standins import Producer

from app.clock import ManualClock
from app.config import Settings
from app.contracts import contract, decode, encode
from app.contracts.names import FEATURE_NAMES_MAX
from app.drift.joinbuffer import JoinBuffer
from app.extender.predictions import prediction_value
from app.kafka.batches import BatchSender, partition_for
from app.registry.directory import DirectoryModelStore
from app.streams.app import create_app
from app.streams.context import context_of
from app.streams.feedback_join import register_join
from app.streams.feedback_models import ModelCache
from app.streams.feedback_options import FeedbackOptions
from app.streams.feedback_state import FeedbackLoop
from app.streams.intake import PartitionIntake
from app.streams.node_table import NodeStore
from app.streams.options import WorkerOptions
from app.streams.sample_check import SampleCheck

S = Settings.from_env({"RTT_METRICS_PORT": "0"}, topic_prefix="u-")
SAMPLES, DEAD = S.topic("training-samples"), S.topic("dead-letters")
BAD_METRIC = "gpu_util[0]"  # XGBoost refuses '[': a name no contract takes, kept by a node's window all the same


@dataclasses.dataclass
class Join:
    loop: FeedbackLoop
    intake: PartitionIntake
    producer: Producer
    app: Any

    def on(self, topic: str, value: dict[str, Any]) -> None:
        self.intake.handlers[topic](decode(topic, encode(topic, value)), 0)

    def scrape(self, node: str, metrics: dict[str, float], ts: float = 990.0) -> None:
        """Fold a scrape into the node's state as the node-metrics intake does (no contract check here: the names a
        window restored from an older release's changelog carries are not checked again either)."""
        state = self.loop.nodes.store.state(node, 0, lambda _: None)
        state.update({"node": node, "ts": ts, "node_class": "gpu", "gpu_model": "Tesla M40", "metrics": metrics}, 0)

    def ship(self) -> None:
        assert self.intake.sender is not None
        asyncio.run(self.intake.sender.flush())

    def sent(self, topic: str) -> list[tuple[bytes | None, bytes | None]]:
        return [(k, v) for t, k, v in self.producer.log if t == topic]

    def dropped(self, reason: str) -> float:
        return self.loop.metrics.feedback.samples_dropped.labels(reason)._value.get()

    def dead_counted(self, reason: str) -> float:
        return context_of(self.app).dead.metrics.dead_letters.labels("training-samples", reason)._value.get()


@pytest.fixture
def join(tmp_path: Path) -> Join:
    clock = ManualClock(1000.0)
    options = dataclasses.replace(WorkerOptions(), datadir=str(tmp_path))
    app = create_app(S, id=f"t-{tmp_path.name}", components=[], options=options, clock=clock)
    nodes = SimpleNamespace(store=NodeStore(10.0, WorkerOptions(), 1.0), table=SimpleNamespace(data={}))
    loop = FeedbackLoop(S, FeedbackOptions(join_prediction_wait_s=0), clock, nodes,  # type: ignore[arg-type]
                        ModelCache(S, store=DirectoryModelStore(tmp_path / "models")),
                        JoinBuffer(600.0, clock=clock), None)  # type: ignore[arg-type]
    intake = register_join(app, loop)
    producer = Producer()
    intake.sender = BatchSender(producer, on_delivered=intake._delivered,  # type: ignore[arg-type]
                                on_failed=intake._failed)
    return Join(loop, intake, producer, app)


def completion(task: str, node: str = "gpu-1") -> dict[str, Any]:
    return {"task_id": task, "app": "gCTF", "node": node, "submitted_ts": 994.0, "started_ts": 995.0,
            "finished_ts": 997.0, "rtt_ms": 2000.0, "status": "ok"}


def test_a_sample_with_a_feature_name_the_contract_refuses_goes_to_dead_letters(join: Join) -> None:
    join.scrape("gpu-1", {"gpu_util": 50.0})
    join.scrape("gpu-2", {"gpu_util": 50.0, BAD_METRIC: 1.0})
    join.on("task-completions", completion("t-good", "gpu-1"))
    join.on("task-completions", completion("t-bad", "gpu-2"))
    join.ship()

    (sample,) = join.sent(SAMPLES)  # the good one only
    assert decode("training-samples", sample[1], strict=True)["task_id"] == "t-good"
    (letter,) = join.sent(DEAD)
    d = decode("dead-letters", letter[1])
    assert letter[0] == SAMPLES.encode() and d["topic"] == SAMPLES and d["reason"] == "schema"
    assert d["offset"] == -1 and d["partition"] == partition_for(b"gCTF:gpu", contract("training-samples").partitions)
    assert d["key"] == "gCTF:gpu" and f"{BAD_METRIC}__" in d["error"]
    assert orjson.loads(base64.b64decode(d["raw"]))["task_id"] == "t-bad"
    assert join.dropped("contract") == 1 and join.dead_counted("schema") == 1
    assert join.loop.samples_per_key["gCTF:gpu"] == 1  # the refused one is no sample of its key


def test_a_held_completion_whose_sample_breaks_the_contract_goes_to_dead_letters(join: Join) -> None:
    join.on("task-completions", completion("t-held"))  # no metrics, no prediction: held for its node's class
    assert join.loop.buffer.held_keys and not join.producer.log
    join.scrape("gpu-1", {BAD_METRIC: 1.0})
    join.on("rtt-predictions", prediction_value("t-held", "gCTF", "gpu-1", 993.0, 100.0, 3, "gCTF:gpu", None))
    join.ship()

    assert not join.sent(SAMPLES) and not join.loop.buffer.held_keys  # made (refused), no longer held
    (letter,) = join.sent(DEAD)
    assert decode("dead-letters", letter[1])["reason"] == "schema"
    assert join.dropped("contract") == 1 and join.dead_counted("schema") == 1


# -- the fast check answers as the contract does ---------------------------------------------------------------------

NAMES = st.one_of(st.from_regex(r"[A-Za-z_][A-Za-z0-9_.:-]{0,12}", fullmatch=True),
                  st.sampled_from(["gpu_util[0]__mean", "a<b", "", "9lives", "x" * 201, "cpu iowait", "n\n"]),
                  st.text(max_size=6))
NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**16), 10**16),
                    st.sampled_from([1e15, -1e15, 1e15 + 1, True, None, "1"]))
BASE = {"model_key": "gCTF:gpu", "task_id": "t1", "app": "gCTF", "node": "gpu-1", "node_class": "gpu",
        "gpu_model": "Tesla M40", "started_ts": 995.0, "rtt_ms": 2000.0, "input_size_mb": None, "window_s": 10.0,
        "features": {}, "predicted_rtt_ms": None, "model_version": None}
CHANGES = st.sampled_from([{}, {"model_key": "gCTF:tpu"}, {"app": "-x"}, {"node_class": "fpga"},
                           {"gpu_model": "g" * 129}, {"started_ts": -1.0}, {"rtt_ms": math.nan}, {"window_s": 0},
                           {"model_version": 3}, {"model_version": 3.0}, {"model_version": True},
                           {"predicted_rtt_ms": 1.5}, {"input_size_mb": 2}, {"extra": 1}, {"task_id": ""}])


def agree(value: dict[str, Any]) -> None:
    raw = encode("training-samples", value, check=False)
    try:
        decode("training-samples", raw, strict=True)
        reference = None
    except Exception as exc:
        reference = str(exc)
    got = SampleCheck()(value, raw)
    assert (None if got is None else str(got)) == reference


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(NAMES, NUMBERS, max_size=6), CHANGES)
def test_the_check_answers_as_the_contract(features: dict[str, Any], change: dict[str, Any]) -> None:
    agree({**BASE, **change, "features": features})


def test_the_check_refuses_more_features_than_the_contract_takes() -> None:
    for n in (FEATURE_NAMES_MAX, FEATURE_NAMES_MAX + 1):
        agree({**BASE, "features": {f"f{i}__mean": float(i) for i in range(n)}})


def test_a_sample_the_contract_takes_is_not_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check stays fast: a valid sample of the usual shape never reaches the reference decoder."""
    import app.streams.sample_check as sample_check

    check = SampleCheck()
    monkeypatch.setattr(sample_check, "decode", lambda *a, **k: pytest.fail("the reference decoder was asked"))
    value = {**BASE, "model_version": 3, "predicted_rtt_ms": 1900.0, "input_size_mb": 8.0,
             "features": {f"m{i}__{a}": float(i) for i in range(30) for a in ("mean", "std", "min", "max", "last")}}
    assert check(value, encode("training-samples", value, check=False)) is None
