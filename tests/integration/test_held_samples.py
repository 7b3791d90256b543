"""A completion read before its node's metrics waits for them (through a restart), then makes its sample once.

The worker's two intakes (node-metrics; completions and predictions) read at their own pace, so a
completion can come before anything says what class its node is. It is held with its join entry, in the
checkpoint too, and makes its sample when the node's metrics come (or a prediction naming a model key):
here across a SIGKILL and a restart, with the metrics sent only to the second worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import signal
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
QUIET = Node("gpu-quiet", "Tesla M40", 150.0, util=42.0)  # its metrics come late
NAMED = Node("gpu-named", "Tesla K20c", 250.0, util=10.0)  # never any metrics; a prediction names its class
HELD = "rtt_worker_training_samples_held"


async def wait_metric(url: str, name: str, value: float, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (seen := metric_value(scrape(url), name)) != value:
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} is {seen}, not {value}, after {timeout_s}s")
        await asyncio.sleep(0.1)


def test_completions_wait_for_their_nodes_class_through_a_restart(kafka_settings: Settings, redis_url: str,
                                                                  tmp_path: Path) -> None:
    s = dataclasses.replace(kafka_settings, redis_url=redis_url)
    rng = random.Random(5)
    t0 = time.time()
    quiet = [task(f"q-{i}", APP, QUIET, t0 + i * 0.05, rng) for i in range(10)]
    named = task("n-0", APP, NAMED, t0, rng)
    with ProcessGroup(tmp_path) as group:
        url = start_worker(group, s, "first")

        async def first_life() -> list[dict[str, Any]]:
            async with Sender(s) as out, Reader(s, "training-samples") as samples:
                for c in quiet + [named]:
                    await out.send("task-completions", c)
                await out.flush()
                await wait_metric(url, HELD, len(quiet) + 1, 20.0)
                await asyncio.sleep(2.5)  # two checkpoints
                return list(samples.values)

        before = asyncio.run(first_life())
        first = group.children.pop("first")
        first.send_signal(signal.SIGKILL)
        first.wait(10)

        url = start_worker(group, s, "second")

        async def second_life() -> dict[str, Any]:
            async with Sender(s) as out, Reader(s, "training-samples") as samples:
                await wait_metric(url, HELD, len(quiet) + 1, 20.0)  # restored from the checkpoint
                p = prediction(named["task_id"], APP, NAMED.name, t0, 300.0)
                await out.send("rtt-predictions", {**p, "model_key": f"{APP}:gpu"})
                await out.flush()
                await samples.wait(lambda v: any(x["task_id"] == named["task_id"] for x in v), 10.0,
                                   "the sample of the completion whose prediction named its class")
                for k in range(6):
                    await out.send("node-metrics", snapshot(QUIET, t0 - 3.0 + k * 0.5, rng))
                await out.flush()
                await samples.wait(lambda v: {x["task_id"] for x in v} >= {c["task_id"] for c in quiet}, 15.0,
                                   "the samples of the held completions")
                await wait_metric(url, HELD, 0, 5.0)
                await asyncio.sleep(2.0)  # a sample made twice would show up by now
                return {"samples": list(samples.values), "page": scrape(url)}

        r = asyncio.run(second_life())

    assert before == []  # nothing was known about either node in the first life
    ids = [x["task_id"] for x in r["samples"]]
    assert sorted(ids) == sorted(c["task_id"] for c in quiet + [named])  # each exactly once
    for x in r["samples"]:
        if x["node"] == QUIET.name:
            assert x["model_key"] == f"{APP}:gpu" and x["gpu_model"] == QUIET.gpu_model
            assert x["features"]["nvidia_smi_utilization_gpu__mean"] == pytest.approx(QUIET.util / 100, abs=0.02)
        else:
            assert x["model_key"] == f"{APP}:gpu" and x["predicted_rtt_ms"] == 300.0
    assert metric_value(r["page"], 'rtt_worker_training_samples_dropped_total{reason="unknown_node"}') == 0
