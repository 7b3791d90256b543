"""A worker killed with SIGKILL mid-stream and restarted: join state and windows come back, nothing counts twice.

The first worker sees node metrics, predictions for 60 tasks and the completions of 30 of them, reports
their errors, and is killed. The second one gets the other 30 completions (whose predictions it only
knows from the recovered join state), redeliveries of completions and predictions the first one had
already counted, and no new metrics: its samples' features come from the recovered node windows. Node names
with ``|`` (the separator of the feedback table's row keys) come back as the nodes they are.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from app.cli.processes import ProcessGroup
from app.config import Settings
from app.sim.scripted import Node, Reader, Sender, metric_value, prediction, snapshot, start_worker, task

pytestmark = pytest.mark.integration

APP = "gCTF"
NODES = [Node("gpu-r1", "Tesla K20c", 200.0, util=30.0), Node("gpu-r2", "Tesla M40", 120.0, util=60.0)]
BARRED = [dataclasses.replace(n, name=n.name.replace("-", "|")) for n in NODES]  # gpu|r1, gpu|r2


def counted(errors: list[dict[str, Any]]) -> int:
    return sum(e["apps"][APP]["n"] for e in errors if APP in e["apps"])


def tasks(lo: int, hi: int, t0: float, nodes: list[Node] = NODES) -> list[dict[str, Any]]:
    rng = random.Random(lo)
    return [task(f"task-{i}", APP, nodes[i % 2], t0 + i * 0.05, rng) for i in range(lo, hi)]


async def send_metrics(out: Sender, t0: float, rng: random.Random, nodes: list[Node] = NODES) -> None:
    """Eight snapshots of every node in the 4 s before ``t0``."""
    for k in range(8):
        for n in nodes:
            await out.send("node-metrics", snapshot(n, t0 - 4.0 + k * 0.5, rng))


def predicted(c: dict[str, Any], t0: float) -> dict[str, Any]:
    """The prediction of completion ``c`` (10 % high)."""
    return prediction(c["task_id"], APP, c["node"], t0, c["rtt_ms"] * 1.1)


async def first_life(s: Settings, t0: float, nodes: list[Node]) -> list[dict[str, Any]]:
    rng = random.Random(1)
    done = tasks(0, 60, t0, nodes)
    async with Sender(s) as out, Reader(s, "prediction-errors") as errors:
        await send_metrics(out, t0, rng, nodes)
        for c in done:
            await out.send("rtt-predictions", predicted(c, t0))
        await out.flush()
        await asyncio.sleep(1.0)
        for c in done[:30]:
            await out.send("task-completions", c)
        await out.flush()
        await errors.wait(lambda v: counted(v) >= 30, 30.0, "30 joined pairs")
        await asyncio.sleep(1.5)  # one more checkpoint of the join state
    return done


async def second_life(s: Settings, done: list[dict[str, Any]], t0: float) -> dict[str, Any]:
    async with (Sender(s) as out, Reader(s, "prediction-errors") as errors,
                Reader(s, "training-samples") as samples):
        for c in done[20:60]:  # 20..29 again (a redelivery), then the 30 the first worker never saw
            await out.send("task-completions", c)
        for c in done[:10]:
            await out.send("rtt-predictions", predicted(c, t0))
        await out.flush()
        await errors.wait(lambda v: counted(v) >= 60, 45.0, "60 joined pairs")
        await asyncio.sleep(3 * s.error_period_s)  # any double count would show up by now
        await samples.wait(lambda v: {x["task_id"] for x in v} >= {c["task_id"] for c in done[30:]}, 10.0)
        return {"errors": list(errors.values), "samples": list(samples.values)}


@pytest.mark.parametrize("nodes", [NODES, BARRED], ids=["plain", "bar-in-name"])
def test_sigkill_and_restart(kafka_settings: Settings, redis_url: str, tmp_path: Path, nodes: list[Node]) -> None:
    s = dataclasses.replace(kafka_settings, redis_url=redis_url, error_period_s=1.0)
    t0 = time.time()
    with ProcessGroup(tmp_path) as group:
        start_worker(group, s, "first")
        done = asyncio.run(first_life(s, t0, nodes))
        first = group.children.pop("first")
        first.send_signal(signal.SIGKILL)
        first.wait(10)

        url = start_worker(group, s, "second")
        r = asyncio.run(second_life(s, done, t0))
        text = urllib.request.urlopen(url, timeout=5).read().decode()

    # every task's pair is counted exactly once over both lives, per node too
    assert counted(r["errors"]) == 60
    for n in nodes:
        assert sum(e["apps"][APP]["n"] for e in r["errors"] if e["node"] == n.name) == 30
    # the redeliveries were recognised as duplicates by the second worker (from the recovered state)
    assert metric_value(text, 'rtt_worker_join_total{outcome="duplicate"}') >= 20
    # its samples' features come from the recovered windows: no metrics were sent after the restart
    late = {x["task_id"]: x for x in r["samples"] if int(x["task_id"].split("-")[1]) >= 30}
    assert len(late) == 30
    for x in late.values():
        node = next(n for n in nodes if n.name == x["node"])
        assert x["features"]["nvidia_smi_utilization_gpu__mean"] == pytest.approx(node.util / 100, abs=0.02)
        assert x["gpu_model"] == node.gpu_model and x["window_s"] == s.feature_window_s


async def life_before_checkpoint(s: Settings, url: str, t0: float) -> list[dict[str, Any]]:
    """20 pairs reported (so recorded), then 20 more pairs read but not recorded yet."""
    rng = random.Random(2)
    done = tasks(100, 140, t0)
    async with Sender(s) as out, Reader(s, "prediction-errors") as errors:
        await send_metrics(out, t0, rng)
        for c in done[:20]:
            await out.send("rtt-predictions", predicted(c, t0))
            await out.send("task-completions", c)
        await out.flush()
        await errors.wait(lambda v: counted(v) >= 20, 30.0, "the first 20 pairs reported")
        for c in done[20:]:
            await out.send("rtt-predictions", predicted(c, t0))
            await out.send("task-completions", c)
        await out.flush()
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline:
            text = urllib.request.urlopen(url, timeout=5).read().decode()
            if metric_value(text, 'rtt_worker_join_total{outcome="matched"}') >= 40:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the first worker did not match 40 pairs")
    return done


def test_sigkill_before_a_checkpoint_loses_nothing(kafka_settings: Settings, redis_url: str,
                                                   tmp_path: Path) -> None:
    """Pairs read but not yet recorded when the worker dies are read again by the next one: counted once."""
    s = dataclasses.replace(kafka_settings, redis_url=redis_url, error_period_s=5.0)
    t0 = time.time()
    with ProcessGroup(tmp_path) as group:
        url = start_worker(group, s, "first", RTT_WORKER_CHECKPOINT_INTERVAL_S="60")
        done = asyncio.run(life_before_checkpoint(s, url, t0))
        first = group.children.pop("first")
        first.send_signal(signal.SIGKILL)
        first.wait(10)

        url = start_worker(group, s, "second", RTT_ERROR_PERIOD_S="1")

        async def second() -> dict[str, Any]:
            async with Reader(s, "prediction-errors") as errors, Reader(s, "training-samples") as samples:
                await errors.wait(lambda v: counted(v) >= 40, 45.0, "40 joined pairs")
                await asyncio.sleep(3.0)  # any double count would show up by now
                return {"errors": list(errors.values), "samples": list(samples.values)}

        r = asyncio.run(second())
    assert counted(r["errors"]) == 40, [(e["node"], e["apps"][APP]["n"]) for e in r["errors"]]
    assert {x["task_id"] for x in r["samples"]} >= {c["task_id"] for c in done}
