"""A completion produced before its prediction still makes a training sample with ``predicted_rtt_ms``.

The extender publishes a prediction only tens of milliseconds before its task ends, so a slow prediction path puts
it behind the completion on the worker; the completion waits for it (``RTT_JOIN_PREDICTION_WAIT_S``). A completion
whose prediction never comes makes its sample without one at the deadline, counted in
``rtt_worker_training_samples_without_prediction_total``.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest
from worker_group import scrape

from app.cli.processes import ProcessGroup
from app.config import Settings
from app.sim.scripted import Node, Reader, Sender, metric_value, prediction, snapshot, start_worker, task

pytestmark = pytest.mark.integration

APP = "gCTF"
NODE = Node("gpu-late", "Tesla M40", 150.0, util=30.0)
WITHOUT = "rtt_worker_training_samples_without_prediction_total"


def test_a_prediction_produced_after_its_completion_is_in_the_sample(kafka_settings: Settings,
                                                                     tmp_path: Path) -> None:
    rng = random.Random(7)
    t0 = time.time()
    late, never = task("late-0", APP, NODE, t0, rng), task("never-0", APP, NODE, t0 + 0.1, rng)
    with ProcessGroup(tmp_path) as group:
        url = start_worker(group, kafka_settings, RTT_JOIN_PREDICTION_WAIT_S="3")

        async def scenario() -> list[dict[str, Any]]:
            async with (Sender(kafka_settings) as out, Reader(kafka_settings, "training-samples") as samples,
                        Reader(kafka_settings, "node-features") as features):
                for k in range(6):
                    await out.send("node-metrics", snapshot(NODE, t0 - 3.0 + k * 0.5, rng))
                await out.flush()
                # the node's class known first: the completion waits for nothing but its prediction
                await features.wait(lambda v: any(x["node"] == NODE.name for x in v), 20.0, "the node's features")
                for c in (late, never):
                    await out.send("task-completions", c)
                await out.flush()
                await asyncio.sleep(1.0)  # read by the worker, within its 3 s wait
                await out.send("rtt-predictions", prediction(late["task_id"], APP, NODE.name, t0, 321.0, 4))
                await out.flush()
                await samples.wait(lambda v: {x["task_id"] for x in v} >= {"late-0", "never-0"}, 20.0,
                                   "both samples")
                await asyncio.sleep(1.5)  # a sample made twice would show up by now
                return list(samples.values)

        values = asyncio.run(scenario())
        page = scrape(url)

    by_task = {x["task_id"]: x for x in values}
    assert sorted(x["task_id"] for x in values) == ["late-0", "never-0"]  # each once
    assert by_task["late-0"]["predicted_rtt_ms"] == 321.0 and by_task["late-0"]["model_version"] == 4
    assert by_task["never-0"]["predicted_rtt_ms"] is None
    assert metric_value(page, WITHOUT) == 1.0
