"""The worker (a subprocess, real broker) copies a prediction's decision-time features into training samples.

The test plays the extender: a prediction with ``features`` (``running_pods_<app>``) for each task, then
the task's completion. A completion that never had a prediction makes a sample without them.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from app.cli.processes import ProcessGroup
from app.config import Settings
from app.sim.scripted import Node, Reader, Sender, prediction, snapshot, start_worker, task

pytestmark = pytest.mark.integration


def predictions_read(metrics_url: str) -> float:
    """How many rtt-predictions the worker has read (its /metrics)."""
    with urllib.request.urlopen(metrics_url, timeout=5) as resp:
        page = resp.read().decode()
    found = re.search(r'^rtt_worker_messages_in_total\{topic="rtt-predictions"\} (\S+)$', page, re.M)
    return float(found.group(1)) if found else 0.0


async def scenario(s: Settings, app: str, metrics_url: str) -> list[dict[str, Any]]:
    rng = random.Random(3)
    gpu = Node("gpu-a", "Tesla M40", 300.0)
    async with (Sender(s) as out, Reader(s, "training-samples") as samples,
                Reader(s, "node-features") as features):
        async def tick() -> float:  # one scrape a second or so, in real time
            now = time.time()
            await out.send("node-metrics", snapshot(gpu, now, rng))
            await out.flush()
            return now

        deadline = time.monotonic() + 60
        while not features.values:  # the worker consumes live once it publishes node-features
            assert time.monotonic() < deadline, "no node-features from the worker"
            await tick()
            await asyncio.sleep(0.5)
        await out.send("task-completions", task("bare", app, gpu, await tick(), rng))  # no prediction
        for i in range(3):
            tid, now = f"t{i}", await tick()
            p = prediction(tid, app, gpu.name, now, 500.0, None)
            p["features"] = {f"running_pods_{app}": float(i + 1), "running_pods_other": 0.0}
            await out.send("rtt-predictions", p)
            await out.flush()
            deadline = time.monotonic() + 20
            while predictions_read(metrics_url) < i + 1:  # the prediction is in before its completion is sent
                assert time.monotonic() < deadline, f"the worker did not read prediction {tid}"
                await asyncio.sleep(0.05)
            await out.send("task-completions", task(tid, app, gpu, now, rng))
            await out.flush()
        await samples.wait(lambda vs: {"bare", "t0", "t1", "t2"} <= {v["task_id"] for v in vs}, 30, "4 samples")
        return list(samples.values)


def test_samples_carry_the_features_of_their_own_prediction(kafka_settings: Settings, tmp_path: Path) -> None:
    app = f"fft{uuid.uuid4().hex[:6]}"
    with ProcessGroup(tmp_path) as group:
        url = start_worker(group, kafka_settings)
        values = asyncio.run(scenario(kafka_settings, app, url))
    by_task = {v["task_id"]: v for v in values}
    assert not any(k.startswith("running_pods_") for k in by_task["bare"]["features"])
    with_features = [t for t in ("t0", "t1", "t2") if f"running_pods_{app}" in by_task[t]["features"]]
    assert with_features == ["t0", "t1", "t2"], [by_task[t]["features"] for t in ("t0", "t1", "t2")]
    for t in with_features:
        f = by_task[t]["features"]
        assert f[f"running_pods_{app}"] == int(t[1]) + 1 and f["running_pods_other"] == 0.0
        assert f["nvidia_smi_utilization_gpu__mean"] > 0  # the node's window is still there
        assert by_task[t]["predicted_rtt_ms"] == 500.0
