"""A second worker joins mid-stream: partitions move with their state and read positions, nothing is lost or doubled.

The first worker alone sees the metrics of eight nodes (one per partition), a first batch of pairs (counted),
and the predictions of a second batch whose completions have not come yet (waiting in its join buffer).
Then a second worker joins the group: the first stops reading the partitions it loses, checkpoints them
and drops their nodes; the second restores their join entries, node trackers and read positions. The
second batch's completions and a third batch of pairs follow. Every pair must be counted exactly once
over both workers, every completion must have made a training sample, and the second worker must have
matched completions against predictions it only knows from the restored state.

When the second worker leaves again, the first gets back the partitions it lost. It no longer keeps their
rows in memory (a revoke drops them), so what it serves of them comes from their changelogs: the join
entries waiting there and every node's window.
"""

from __future__ import annotations

import asyncio
import collections
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from worker_group import labelled, scrape, start_workers, wait_settled

from app.cli.processes import ProcessGroup
from app.config import Settings
from app.contracts import contract
from app.sim.scripted import Node, Reader, Sender, metric_value, nodes_per_partition, prediction, snapshot, task

pytestmark = pytest.mark.integration

APP = "gCTF"
PARTITIONS = contract("node-metrics").partitions
NODES = [Node(name, "Tesla M40", 100.0 + 20 * i, util=10.0 + 8 * i)
         for i, name in enumerate(nodes_per_partition(PARTITIONS))]
ENV = {"RTT_ERROR_PERIOD_S": "1", "RTT_FEATURE_EMIT_INTERVAL_S": "0.2", "RTT_WORKER_SESSION_TIMEOUT_S": "6"}


def counted(values: list[dict[str, Any]]) -> collections.Counter[str]:
    total: collections.Counter[str] = collections.Counter()
    for v in values:
        if APP in v["apps"]:
            total[v["node"]] += v["apps"][APP]["n"]
    return total


def batch(name: str, t0: float, rng: random.Random) -> list[dict[str, Any]]:
    return [task(f"{name}-{n.name}-{i}", APP, n, t0 + i * 0.1, rng) for n in NODES for i in range(3)]


def pred(c: dict[str, Any]) -> dict[str, Any]:
    return prediction(c["task_id"], APP, c["node"], c["started_ts"], c["rtt_ms"] * 1.1)


def test_a_worker_joining_mid_stream_takes_over_state_and_positions(kafka_settings: Settings,
                                                                     tmp_path: Path) -> None:
    s = kafka_settings
    rng = random.Random(11)
    t0 = time.time()
    first, second, third = batch("a", t0, rng), batch("b", t0 + 1, rng), batch("c", t0 + 2, rng)

    with ProcessGroup(tmp_path) as group:
        urls = start_workers(group, s, ["w1"], **ENV)
        wait_settled(group, ["w1"], PARTITIONS)

        async def before_join() -> None:
            async with Sender(s) as out, Reader(s, "prediction-errors") as errors:
                for k in range(6):
                    for n in NODES:
                        await out.send("node-metrics", snapshot(n, t0 - 3.0 + k * 0.5, rng))
                for c in first:
                    await out.send("rtt-predictions", pred(c))
                    await out.send("task-completions", c)
                for c in second:
                    await out.send("rtt-predictions", pred(c))
                await out.flush()
                await errors.wait(lambda v: sum(counted(v).values()) >= len(first), 30.0, "the first batch")

        asyncio.run(before_join())
        urls.update(start_workers(group, s, ["w2"], **ENV))
        settled = wait_settled(group, ["w1", "w2"], PARTITIONS)

        async def after_join() -> dict[str, Any]:
            async with (Sender(s) as out, Reader(s, "prediction-errors") as errors,
                        Reader(s, "training-samples") as samples):
                for c in second:
                    await out.send("task-completions", c)
                for c in third:
                    await out.send("rtt-predictions", pred(c))
                    await out.send("task-completions", c)
                await out.flush()
                total = len(first) + len(second) + len(third)
                await errors.wait(lambda v: sum(counted(v).values()) >= total, 45.0, "every pair counted")
                await asyncio.sleep(3.0)  # a pair counted twice would show up by now
                every = {c["task_id"] for c in first + second + third}
                await samples.wait(lambda v: {x["task_id"] for x in v} >= every, 20.0,
                                   "a training sample for every completion")
                return {"errors": list(errors.values), "samples": list(samples.values)}

        r = asyncio.run(after_join())
        pages = {w: scrape(url) for w, url in urls.items()}
        assert wait_settled(group, ["w1", "w2"], PARTITIONS, timeout_s=5) == settled, "rebalanced during the test"

    # every pair counted exactly once, per node, over both workers
    assert counted(r["errors"]) == collections.Counter({n.name: 9 for n in NODES})
    # the second worker matched the second batch's completions of its partitions with predictions it only
    # knows from the first worker's checkpoint (3 per node), plus the third batch (3 per node)
    moved = {n.name for n in NODES if nodes_per_partition(PARTITIONS).index(n.name) in settled["w2"].partitions}
    assert moved
    assert metric_value(pages["w2"], 'rtt_worker_join_total{outcome="matched"}') == 6 * len(moved)
    assert metric_value(pages["w2"], 'rtt_worker_join_total{outcome="duplicate"}') == 0
    # a node weight is shown by the worker that holds the node: none left frozen on the one that lost it
    assert set(labelled(pages["w2"], "rtt_worker_node_weight", "node")) == moved
    assert set(labelled(pages["w1"], "rtt_worker_node_weight", "node")) == {n.name for n in NODES} - moved


def test_partitions_given_back_are_restored_from_their_changelogs(kafka_settings: Settings, tmp_path: Path) -> None:
    s = kafka_settings
    rng = random.Random(12)
    t0 = time.time()
    waiting = batch("a", t0, rng)  # predictions whose completions come once the first worker holds everything again
    snapshots = 6

    with ProcessGroup(tmp_path) as group:
        urls = start_workers(group, s, ["w1"], **ENV)
        wait_settled(group, ["w1"], PARTITIONS)

        async def before_join() -> None:
            async with Sender(s) as out:
                for k in range(snapshots):
                    for n in NODES:
                        await out.send("node-metrics", snapshot(n, t0 - 3.0 + k * 0.5, rng))
                for c in waiting:
                    await out.send("rtt-predictions", pred(c))
                await out.flush()
            deadline = time.monotonic() + 30.0
            while metric_value(scrape(urls["w1"]), "rtt_worker_join_entries") < len(waiting):
                assert time.monotonic() < deadline, "the first worker did not read the predictions"
                await asyncio.sleep(0.2)

        asyncio.run(before_join())
        start_workers(group, s, ["w2"], **ENV)
        settled = wait_settled(group, ["w1", "w2"], PARTITIONS)
        second = group.children.pop("w2")
        second.send_signal(signal.SIGTERM)  # a clean stop: it leaves the group, the first worker gets all back
        assert second.wait(30) == 0
        back = wait_settled(group, ["w1"], PARTITIONS)
        assert back["w1"].generation > settled["w1"].generation

        async def given_back() -> dict[str, Any]:
            async with (Sender(s) as out, Reader(s, "node-features") as features,
                        Reader(s, "prediction-errors") as errors):
                for n in NODES:
                    await out.send("node-metrics", snapshot(n, t0, rng))
                for c in waiting:
                    await out.send("task-completions", c)
                await out.flush()
                names = {n.name for n in NODES}
                await features.wait(lambda vs: {v["node"] for v in vs if v["count"] == snapshots + 1} >= names,
                                    30.0, "node-features with every snapshot of every node")
                await errors.wait(lambda v: sum(counted(v).values()) >= len(waiting), 30.0, "every pair counted")
                return {"errors": list(errors.values)}

        r = asyncio.run(given_back())
        page = scrape(urls["w1"])
        log_text = (group.log_dir / "w1.log").read_text(errors="replace")

    moved = settled["w2"].partitions
    assert moved and back["w1"].partitions == frozenset(range(PARTITIONS))
    # the join entries of the partitions given back came from their changelog (the latest restore)
    restored = log_text.rsplit(f"partitions {sorted(range(PARTITIONS))}: restored ", 1)[1]
    assert restored.startswith(f"{3 * len(moved)} join entries"), restored[:80]
    assert metric_value(page, 'rtt_worker_join_total{outcome="matched"}') == len(waiting)
    assert counted(r["errors"]) == collections.Counter({n.name: 3 for n in NODES})
