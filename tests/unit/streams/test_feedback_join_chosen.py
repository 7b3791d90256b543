"""The join keeps the prediction the extender marked ``chosen`` when its buffer is full (the mark read from the
message, absent: not chosen)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

from app.clock import ManualClock
from app.config import Settings
from app.contracts import decode, encode
from app.drift.joinbuffer import EXPIRED, JoinBuffer
from app.extender.predictions import prediction_value
from app.registry.directory import DirectoryModelStore
from app.streams.app import create_app
from app.streams.feedback_join import register_join
from app.streams.feedback_models import ModelCache
from app.streams.feedback_options import FeedbackOptions
from app.streams.feedback_state import FeedbackLoop
from app.streams.node_table import NodeStore
from app.streams.options import WorkerOptions


def test_a_full_join_lets_the_unchosen_predictions_go_first(tmp_path: Path) -> None:
    settings = Settings(metrics_port=0)
    clock = ManualClock(1000.0)
    app = create_app(settings, id=f"t-{tmp_path.name}", components=[],
                     options=dataclasses.replace(WorkerOptions(), datadir=str(tmp_path)), clock=clock)
    nodes = SimpleNamespace(store=NodeStore(10.0, WorkerOptions(), 1.0), table=SimpleNamespace(data={}))
    loop = FeedbackLoop(settings, FeedbackOptions(), clock, nodes,  # type: ignore[arg-type]
                        ModelCache(settings, store=DirectoryModelStore(tmp_path / "models")),
                        JoinBuffer(60.0, max_entries=2, clock=clock), None)  # type: ignore[arg-type]
    on_prediction = register_join(app, loop).handlers["rtt-predictions"]
    for node, chosen in [("n0", True), ("n1", False), ("n2", False)]:
        value = prediction_value("uid-1", "gCTF", node, 999.0, 100.0, 3, "gCTF:gpu", None, chosen=chosen)
        on_prediction(decode("rtt-predictions", encode("rtt-predictions", value)), 0)
    bare = {"task_id": "uid-2", "app": "gCTF", "node": "n0", "ts": 999.5, "predicted_rtt_ms": 90.0,
            "model_version": 3}  # as an extender that does not mark the chosen node sends it
    on_prediction(decode("rtt-predictions", encode("rtt-predictions", bare)), 0)
    assert [(e.key, e.outcome) for e in loop.buffer.expire()] == [
        (("uid-1", "n1"), EXPIRED), (("uid-1", "n2"), EXPIRED)]
    assert list(loop.buffer.keys()) == [("uid-1", "n0"), ("uid-2", "n0")]
