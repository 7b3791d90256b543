"""An app retired by the worker (no message named it for RTT_NODE_EVICT_AFTER_S) leaves everything the worker
kept of it, and gets it back, afresh, when it is named again (app.streams.eviction, FeedbackLoop.forget_apps).

Before, only its place under the app cap and two metric series went: its state in every node's tracker, its
node-weights entries, its sample counts and its loaded models (predicted every period) stayed until restart.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import orjson
from test_feedback_models import save

from app.clock import ManualClock
from app.config import Settings
from app.contracts import decode, encode
from app.drift.tracker import NodeTracker
from app.registry.directory import DirectoryModelStore
from app.streams.app import create_app
from app.streams.context import context_of
from app.streams.feedback_state import FeedbackLoop
from app.streams.feedback_table import node_row_key
from app.streams.feedback_weights import weights_values
from app.streams.options import WorkerOptions

AFTER_S = 60.0
NODE = "gpu-1"
KEY = "gCTF:gpu"


class Sender:
    """The intakes' batch sender (samples, node-features): what they would send."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None]] = []

    def add(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
        self.sent.append((topic, key))


class Worker:
    """The worker's components (node-features, feedback loop, eviction) on a manual clock, fed by hand."""

    def __init__(self, tmp_path: Path) -> None:
        self.settings = Settings(metrics_port=0, models_dir=str(tmp_path / "models"), node_evict_after_s=AFTER_S)
        self.store = DirectoryModelStore(tmp_path / "models")
        self.clock = ManualClock(1000.0)
        app = create_app(self.settings, id=f"t-{tmp_path.name}", clock=self.clock,
                         options=dataclasses.replace(WorkerOptions(), datadir=str(tmp_path / "faust")))
        ctx = self.ctx = context_of(app)
        self.loop: FeedbackLoop = ctx.handles["feedback"]
        self.loop.models._store = self.store
        self.nodes = ctx.handles["node_features"]
        self.nodes.intake.sender = self.loop.intake.sender = Sender()  # type: ignore[union-attr]
        self.rows: list[tuple[bytes, bytes | None]] = []

        async def write(rows: Any, **_kw: Any) -> int:  # the feedback table's changelog, as the checkpoint writes it
            rows = list(rows)
            self.rows += rows
            return len(rows)

        self.loop.table.write = write  # type: ignore[method-assign]
        self.task = 0

    def metrics(self, ts: float) -> None:
        snap = {"node": NODE, "ts": ts, "node_class": "gpu", "gpu_model": "Tesla M40",
                "metrics": {"nvidia_smi_utilization_gpu": 0.4}}
        self.nodes.intake.handlers["node-metrics"](decode("node-metrics", encode("node-metrics", snap)), 0)

    def task_of(self, app: str, predicted: float, rtt: float) -> None:
        """A prediction and the completion of one task of ``app`` on the node (a matched pair, a sample)."""
        self.task += 1
        t, now = f"t{self.task}", self.clock.now()
        p = {"task_id": t, "app": app, "node": NODE, "ts": now, "predicted_rtt_ms": predicted, "model_version": None}
        c = {"task_id": t, "app": app, "node": NODE, "submitted_ts": now - 1.0, "started_ts": now - 0.5,
             "finished_ts": now - 0.5 + rtt / 1000.0, "rtt_ms": rtt, "status": "ok"}
        handlers = self.loop.intake.handlers  # type: ignore[union-attr]
        handlers["rtt-predictions"](decode("rtt-predictions", encode("rtt-predictions", p)), 0)
        handlers["task-completions"](decode("task-completions", encode("task-completions", c)), 0)

    def weights(self) -> dict[str, Any]:
        return next(v for v in weights_values(self.loop, self.clock.now()) if v["node"] == NODE)

    def evicted(self, kind: str) -> float:
        return self.ctx.metrics.value("rtt_worker_evicted_total", kind=kind)

    async def settle(self) -> None:
        for _ in range(400):  # a model load runs in an executor thread
            if not self.loop._background:
                return
            await asyncio.sleep(0.01)


def test_a_retired_app_leaves_the_worker_and_comes_back_afresh(tmp_path: Path) -> None:
    w = Worker(tmp_path)
    loop, models = w.loop, w.loop.models
    update = save(w.store, KEY, 1.0)

    async def run() -> None:
        assert await models.apply(update)
        w.metrics(999.0)
        for _ in range(3):
            w.task_of("gCTF", 100.0, 120.0)
            w.task_of("upload", 50.0, 55.0)
        loop.trackers[NODE].close(w.clock.now())
        w.nodes.store.states[NODE].set_window(40.0, "gCTF")
        before = w.weights()
        assert "gCTF" in before["predicted_rtt_ms"] and before["samples"] == {"gCTF": 3, "upload": 3}
        assert loop.samples_per_key[KEY] == 3 and w.nodes.store.app_names["gCTF"]
        await loop.checkpoint()

        # upload and the node are heard of until the eviction; gCTF is not
        w.clock.advance(AFTER_S - 1.0)
        w.task_of("upload", 50.0, 55.0)
        w.metrics(w.clock.now())
        w.clock.advance(1.0)
        w.rows.clear()
        silent, apps = w.ctx.handles["evict"]()
        assert silent == set() and apps == ["gCTF"] and w.evicted("app") == 1.0
        assert "gCTF" not in loop.trackers[NODE].apps and "upload" in loop.trackers[NODE].apps
        assert KEY not in loop.samples_per_key and "gCTF:gpu" not in dict(loop.samples_per_key)
        assert models.version(KEY) is None and models.predictor(KEY) is None and not models.has(KEY)
        assert models.parked[KEY]["version"] == update["version"]  # what reloads it
        assert "gCTF" not in w.nodes.store.states[NODE].windows and "gCTF" not in w.nodes.store.app_names
        assert w.ctx.metrics.registry.get_sample_value("rtt_worker_model_version", {"model_key": KEY}) is None
        after = w.weights()
        assert "gCTF" not in after["predicted_rtt_ms"] and "gCTF" not in after["correction"]
        assert after["samples"] == {"upload": 4}

        # the node's checkpointed tracker no longer holds it: a restart does not bring it back
        await loop.checkpoint()
        row = dict(w.rows)[node_row_key(0, NODE)]
        assert row is not None
        restored = NodeTracker().load(orjson.loads(row))
        assert set(restored.apps) == {"upload"}

        # named again: tracked again from the start, and its model loaded again from the registry
        w.task_of("gCTF", 100.0, 130.0)
        assert models.has(KEY)  # being loaded: no cold start is asked meanwhile
        await w.settle()
        assert models.version(KEY) == update["version"] and models.predictor(KEY) is not None
        assert KEY not in models.parked and not models.returning
        assert loop.trackers[NODE].samples("gCTF") == 1 and loop.samples_per_key[KEY] == 1
        assert "gCTF" in w.weights()["predicted_rtt_ms"]
        assert w.ctx.bounds.apps.keys() == {"gCTF", "upload"}

    asyncio.run(run())


def test_an_update_announced_while_the_app_is_retired_is_the_one_loaded_when_it_returns(tmp_path: Path) -> None:
    w = Worker(tmp_path)
    models = w.loop.models
    v1 = save(w.store, KEY, 1.0)

    async def run() -> None:
        await models.apply(v1)
        w.task_of("gCTF", 100.0, 120.0)
        w.clock.advance(AFTER_S)
        assert w.ctx.handles["evict"]()[1] == ["gCTF"]
        v2 = save(w.store, KEY, 2.0)
        assert not await models.apply(v2)  # parked, not loaded
        assert models.version(KEY) is None and models.parked[KEY]["version"] == v2["version"]
        w.task_of("gCTF", 100.0, 120.0)
        await w.settle()
        assert models.version(KEY) == v2["version"]

    asyncio.run(run())


def test_state_no_message_names_is_retired_after_the_same_silence(tmp_path: Path) -> None:
    """A model read from model-updates at start, or a tracker restored from a checkpoint, of an app no message
    names: retired once RTT_NODE_EVICT_AFTER_S has passed without one (a restart does not keep it forever)."""
    w = Worker(tmp_path)
    loop, models = w.loop, w.loop.models

    async def run() -> None:
        await models.apply(save(w.store, KEY, 1.0))
        old = NodeTracker()
        old.add("oldapp", 10.0, 12.0)
        loop.restore({node_row_key(0, NODE): orjson.dumps(old.to_dict())}, {0})
        assert loop.apps() == {"gCTF", "oldapp"}
        assert w.ctx.handles["evict"]()[1] == []
        w.clock.advance(AFTER_S - 1.0)
        assert w.ctx.handles["evict"]()[1] == []
        w.clock.advance(1.0)
        assert w.ctx.handles["evict"]()[1] == ["gCTF", "oldapp"]
        assert loop.apps() == set() and KEY in models.parked and w.evicted("app") == 2.0

    asyncio.run(run())
