"""``rtt_worker_messages_in_total`` on a real worker killed with SIGKILL between two checkpoints: a message is
counted once its effect is durable, so the messages the restarted worker reads again are counted once over both
lives. They used to be counted as soon as they were processed: once by the killed worker, again by the next."""

from __future__ import annotations

import asyncio
import random
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from app.cli.processes import ProcessGroup
from app.config import Settings
from app.sim.scripted import Node, Reader, Sender, metric_value, snapshot, start_worker

pytestmark = pytest.mark.integration

NODE = Node("gpu-c1", "Tesla M40", 120.0, util=40.0)
SNAPSHOTS = 8
COUNTER = 'rtt_worker_messages_in_total{topic="node-metrics"}'


def read(url: str) -> float:
    return metric_value(urllib.request.urlopen(url, timeout=5).read().decode(), COUNTER)


async def send_and_see(s: Settings) -> None:
    """Eight snapshots of the node, and the worker's node-features holding all of them (processed)."""
    rng = random.Random(4)
    t0 = time.time()
    async with Sender(s) as out, Reader(s, "node-features") as features:
        for k in range(SNAPSHOTS):
            await out.send("node-metrics", snapshot(NODE, t0 - 4.0 + k * 0.5, rng))
        await out.flush()
        await features.wait(lambda vs: any(v["node"] == NODE.name and v["count"] == SNAPSHOTS for v in vs), 30.0,
                            "node-features of every snapshot")


def test_messages_read_again_after_a_sigkill_are_counted_once(kafka_settings: Settings, tmp_path: Path) -> None:
    s = kafka_settings
    with ProcessGroup(tmp_path) as group:
        # no checkpoint of the node windows within the first life: what it reads is never durable
        url = start_worker(group, s, "first", RTT_WORKER_CHECKPOINT_INTERVAL_S="120")
        asyncio.run(send_and_see(s))
        time.sleep(1.0)
        first_count = read(url)
        first = group.children.pop("first")
        first.send_signal(signal.SIGKILL)
        first.wait(10)

        url = start_worker(group, s, "second")  # reads the snapshots again (no position was stored)
        deadline = time.monotonic() + 30
        while (second_count := read(url)) < SNAPSHOTS and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2.0)  # a few checkpoints more: they count nothing again
        second_count = read(url)
    assert first_count == 0  # processed (node-features of them sent), not stored
    assert second_count == SNAPSHOTS
    assert first_count + second_count == SNAPSHOTS
