"""Two workers in one group split the partitions: every node is served, every pair is counted once, by one worker.

Both workers run ``rttsched worker`` with the same topic prefix (same group). Once the group has settled
(both hold partitions of one generation, read from their logs) the test sends metrics for eight nodes,
one per partition, and prediction + completion pairs for two apps on each, then checks:

* node-features arrive for every node, each with all of the node's snapshots in its window (one worker
  holds a node's whole window);
* prediction-errors count every (task_id, node) pair exactly once per node × app, also after a few more
  periods, and node-weights / prediction-errors of a node come from one emitter: a worker's period timer
  (mode's ``Timer``, drift correction bounded to 0.1 s) never fires twice within ``period - 0.1 s``, while
  two workers' timers interleave, so two consecutive messages of a node closer than 0.8 periods (1 s
  period) can only come from two workers;
* each worker's /metrics shows exactly its own share: messages in per topic, matched pairs, the nodes it
  keeps and the nodes it weighs are those of its partitions, both shares non-empty.
"""

from __future__ import annotations

import asyncio
import collections
import random
import time
from pathlib import Path
from typing import Any

import pytest
from worker_group import Assignment, labelled, scrape, start_workers, wait_settled

from app.cli.processes import ProcessGroup
from app.config import Settings
from app.contracts import contract, encode
from app.sim.scripted import Node, Reader, Sender, metric_value, nodes_per_partition, prediction, snapshot, task

pytestmark = pytest.mark.integration

PERIOD_S = 1.0
WORKERS = ("w1", "w2")
APPS = ("gCTF", "Motioncor2")
TASKS_PER_APP = 5
SNAPSHOTS = 6
PARTITIONS = contract("node-metrics").partitions
GPUS = ("Tesla K20c", "Tesla M40", "RTX 4090")
NODES = [Node(name, GPUS[i % 3], 100.0 + 20 * i, util=10.0 + 8 * i)
         for i, name in enumerate(nodes_per_partition(PARTITIONS))]


def min_gap(values: list[dict[str, Any]], node: str) -> float:
    """Smallest time between two consecutive messages of ``node`` (inf for fewer than two)."""
    ts = sorted(v["ts"] for v in values if v["node"] == node)
    return min((b - a for a, b in zip(ts, ts[1:], strict=False)), default=float("inf"))


def counted(values: list[dict[str, Any]]) -> collections.Counter[tuple[str, str]]:
    """Pairs counted per (node, app): the sum of ``n`` over prediction-errors messages."""
    total: collections.Counter[tuple[str, str]] = collections.Counter()
    for v in values:
        for app, entry in v["apps"].items():
            total[(v["node"], app)] += entry["n"]
    return total


async def send(out: Sender, topic: str, value: dict[str, Any]) -> asyncio.Future[Any]:
    return await out.p.send(out.s.topic(topic), encode(topic, value), key=value["node"].encode())


async def scenario(s: Settings) -> dict[str, Any]:
    rng = random.Random(7)
    t0 = time.time()
    pairs: collections.Counter[tuple[str, str]] = collections.Counter()
    async with (Sender(s) as out, Reader(s, "node-features") as features, Reader(s, "prediction-errors") as errors,
                Reader(s, "node-weights") as weights):
        sent: list[tuple[str, asyncio.Future[Any]]] = []
        for k in range(SNAPSHOTS):
            for n in NODES:
                sent.append((n.name, await send(out, "node-metrics", snapshot(n, t0 - 3.0 + k * 0.5, rng))))
        tasks = [task(f"task-{n.name}-{a}-{i}", a, n, t0 - 1.0 + i * 0.1, rng)
                 for n in NODES for a in APPS for i in range(TASKS_PER_APP)]
        for c in tasks:
            p = prediction(c["task_id"], c["app"], c["node"], t0 - 1.0, c["rtt_ms"] * rng.uniform(0.8, 1.2))
            sent.append((c["node"], await send(out, "rtt-predictions", p)))
            pairs[(c["node"], c["app"])] += 1
        for c in tasks:
            sent.append((c["node"], await send(out, "task-completions", c)))
        await out.flush()
        landed = {(node, (await fut).partition) for node, fut in sent}

        await features.wait(lambda vs: {v["node"] for v in vs if v["count"] == SNAPSHOTS} >= {n.name for n in NODES},
                            20.0, "node-features with every snapshot of every node")
        await errors.wait(lambda vs: sum(counted(vs).values()) >= sum(pairs.values()), 30.0, "every pair counted")
        await asyncio.sleep(3 * PERIOD_S)  # a pair counted twice, or by both workers, would show up by now
        await weights.wait(lambda vs: all(sum(v["node"] == n.name for v in vs) >= 5 for n in NODES), 20.0,
                           "five node-weights per node")
        return {"landed": landed, "pairs": pairs, "counted": counted(errors.values), "errors": list(errors.values),
                "weights": list(weights.values), "features": list(features.values)}


def share(assigned: Assignment, landed: set[tuple[str, int]]) -> set[str]:
    """The nodes whose messages went to the partitions of ``assigned``."""
    return {node for node, partition in landed if partition in assigned.partitions}


def test_two_workers_split_the_partitions(kafka_settings: Settings, tmp_path: Path) -> None:
    s = kafka_settings
    with ProcessGroup(tmp_path) as group:
        urls = start_workers(group, s, WORKERS, RTT_ERROR_PERIOD_S=str(PERIOD_S), RTT_FEATURE_EMIT_INTERVAL_S="0.2",
                             RTT_WORKER_SESSION_TIMEOUT_S="6")
        settled = wait_settled(group, WORKERS, PARTITIONS)
        r = asyncio.run(scenario(s))
        pages = {w: scrape(url) for w, url in urls.items()}
        after = wait_settled(group, WORKERS, PARTITIONS, timeout_s=5)
    assert after == settled, f"the group rebalanced during the test: {settled} -> {after}"

    # the keyed messages of each node all landed in one partition, one node per partition
    assert sorted(p for _, p in r["landed"]) == list(range(PARTITIONS))
    names = {n.name for n in NODES}

    # (a) node-features for every node, whose window holds every snapshot of the node
    assert {v["node"] for v in r["features"] if v["count"] == SNAPSHOTS} == names
    assert all(v["count"] <= SNAPSHOTS for v in r["features"])

    # (b) every pair counted exactly once per node × app, and a node's periods reported by one worker
    assert r["counted"] == r["pairs"]
    for n in NODES:
        assert min_gap(r["weights"], n.name) >= 0.8 * PERIOD_S, f"{n.name}: node-weights from two workers"
        assert min_gap(r["errors"], n.name) >= 0.8 * PERIOD_S, f"{n.name}: prediction-errors from two workers"

    # (c) each worker handled exactly the messages of its own partitions, both a non-empty share
    shares = {w: share(settled[w], r["landed"]) for w in WORKERS}
    assert all(shares.values()) and set.union(*shares.values()) == names
    assert not set.intersection(*shares.values())
    for w in WORKERS:
        text, mine = pages[w], shares[w]
        pairs_mine = sum(k for (node, _), k in r["pairs"].items() if node in mine)
        messages_in = labelled(text, "rtt_worker_messages_in_total", "topic")
        assert messages_in.get("node-metrics") == SNAPSHOTS * len(mine), w
        assert messages_in.get("rtt-predictions") == messages_in.get("task-completions") == pairs_mine, w
        assert metric_value(text, 'rtt_worker_join_total{outcome="matched"}') == pairs_mine, w
        assert metric_value(text, "rtt_worker_nodes") == len(mine), w
        assert set(labelled(text, "rtt_worker_node_weight", "node")) == mine, w
