"""Hostile input against a real worker: keys that lie, timestamps from far away, clocks that jump, 10k names.

One worker subprocess, capped at 1,000 nodes and 8 apps, evicting nodes silent for 6 s:

* a node-metrics message whose key names another node, and a completion without a key, go to dead-letters
  (``key_mismatch``);
* a snapshot stamped 9.9e10 (allowed by the contract) goes to dead-letters (``ts_in_future``) and the node's
  later valid snapshots still become node-features — the node is not frozen; one two days old is
  ``ts_too_old``;
* a node whose clock ran 200 s ahead and comes back gets a fresh window (``rtt_worker_clock_resets_total``)
  and its features go on;
* 10,000 node names: the worker holds 1,000 nodes, the rest are dead letters (``node_cap``), its metric
  series stay at the cap and its memory does not follow the names; 6 s of silence later the nodes are
  evicted: from the worker's state and series, and from node-features (tombstones);
* 20 app names: 8 tracked, the others ``app_cap``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from chaoskit import metric, scrape
from feedbackkit import Reader, produce, start_worker

from app.cli.processes import ProcessGroup
from app.config import Settings
from app.contracts import contract, encode
from app.kafka.client import client_options

pytestmark = pytest.mark.integration

CAP_NODES, CAP_APPS = 1000, 8


def snap(node: str, ts: float, util: float = 30.0) -> dict[str, Any]:
    return {"node": node, "ts": ts, "node_class": "gpu", "gpu_model": "Tesla M40",
            "metrics": {"nvidia_smi_utilization_gpu": util, "cpu_iowait": 0.2}}


def completion(task: str, node: str, app: str) -> dict[str, Any]:
    now = time.time()
    return {"task_id": task, "app": app, "node": node, "submitted_ts": now - 2, "started_ts": now - 1.5,
            "finished_ts": now - 0.5, "rtt_ms": 1000.0, "status": "ok"}


async def send_raw(s: Settings, topic: str, items: list[tuple[bytes | None, dict[str, Any]]]) -> None:
    p = AIOKafkaProducer(**client_options(s))
    await p.start()
    try:
        for key, value in items:
            await p.send(s.topic(topic), encode(topic, value), key=key)
        await p.flush()
    finally:
        await p.stop()


class RawReader:
    """node-features with tombstones (value None), by key."""

    def __init__(self, s: Settings, topic: str) -> None:
        self.s, self.topic = s, topic
        self.records: list[tuple[str, dict[str, Any] | None]] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RawReader:
        c = AIOKafkaConsumer(**client_options(self.s, group_id=None, auto_offset_reset="earliest"))
        await c.start()
        c.assign([TopicPartition(self.s.topic(self.topic), p) for p in range(contract(self.topic).partitions)])

        async def run() -> None:
            try:
                while True:
                    for msgs in (await c.getmany(timeout_ms=200)).values():
                        self.records += [(m.key.decode(), orjson.loads(m.value) if m.value else None) for m in msgs]
            finally:
                await c.stop()

        self._task = asyncio.get_running_loop().create_task(run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def until(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} not within {timeout_s} s"
        await asyncio.sleep(0.25)


def test_hostile_input_goes_to_dead_letters_and_nothing_grows_without_bound(kafka_settings: Settings,
                                                                            tmp_path: Path) -> None:
    s = dataclasses.replace(kafka_settings, error_period_s=1.0)
    with ProcessGroup(tmp_path) as group:
        url = start_worker(group, s, "worker", RTT_WORKER_MAX_NODES=str(CAP_NODES), RTT_WORKER_MAX_APPS=str(CAP_APPS),
                           RTT_NODE_EVICT_AFTER_S="6")
        pid = group.children["worker"].pid

        async def scenario() -> dict[str, Any]:
            async with Reader(s, "dead-letters") as dead, RawReader(s, "node-features") as feats:
                now = time.time()
                # keys that lie
                await send_raw(s, "node-metrics", [(b"gpu-liar-2", snap("gpu-liar-1", now))])
                await send_raw(s, "task-completions", [(None, completion("t-nokey", "gpu-liar-1", "gCTF"))])
                # far future, far past, then valid snapshots of the same node
                await produce(s, [("node-metrics", snap("gpu-future", 9.9e10)),
                                  ("node-metrics", snap("gpu-future", now - 2 * 86_400))])
                await produce(s, [("node-metrics", snap("gpu-future", time.time() + 0.1 * k, util=55.0))
                                  for k in range(5)])
                # a node's clock 200 s ahead (within the skew), then right again
                await produce(s, [("node-metrics", snap("gpu-jump", time.time() + 200 + 0.1 * k)) for k in range(3)])
                await asyncio.sleep(1.5)
                await produce(s, [("node-metrics", snap("gpu-jump", time.time() + 0.1 * k, util=77.0))
                                  for k in range(3)])
                await until(lambda: any(k == "gpu-future" and v and v["ts"] < now + 60 for k, v in feats.records),
                            30, "node-features of gpu-future after its far-future snapshot")
                await until(lambda: any(k == "gpu-jump" and v and v["ts"] < now + 60 for k, v in feats.records),
                            30, "node-features of gpu-jump after its clock came back")
                text = scrape(url)
                out: dict[str, Any] = {"clock_resets": metric(text, "rtt_worker_clock_resets_total")}
                # 10,000 node names, and 20 app names
                rss0 = rss_kb(pid)
                t = time.time()
                await produce(s, [("node-metrics", snap(f"n{i:05d}", t)) for i in range(10_000)])
                await produce(s, [("task-completions", completion(f"t-app-{a}", "gpu-future", f"app{a:02d}"))
                                  for a in range(20)])
                await until(lambda: metric(scrape(url), "rtt_worker_dead_letters_total", topic="node-metrics",
                                           reason="node_cap") >= 10_000 - CAP_NODES, 60, "node_cap dead letters")
                await asyncio.sleep(2.5)  # a node-weights period with every held node in it
                text = scrape(url)
                out.update(nodes=metric(text, "rtt_worker_nodes"), rss_growth_kb=rss_kb(pid) - rss0,
                           weight_series=text.count("rtt_worker_node_weight{"),
                           app_cap=metric(text, "rtt_worker_dead_letters_total", reason="app_cap"))
                # silence: every node is evicted
                await until(lambda: metric(scrape(url), "rtt_worker_nodes") == 0, 40, "every node evicted")
                await asyncio.sleep(1.0)
                text = scrape(url)
                out.update(weight_series_after=text.count("rtt_worker_node_weight{"),
                           evicted=metric(text, "rtt_worker_evicted_total", kind="node"),
                           tombstones={k for k, v in feats.records if v is None})
                out["dead"] = {(d["reason"], d["topic"].removeprefix(s.topic_prefix)) for d in dead.values}
                out["dead_n"] = len(dead.values)
                return out

        r = asyncio.run(scenario())
        group.check()

    assert ("key_mismatch", "node-metrics") in r["dead"] and ("key_mismatch", "task-completions") in r["dead"]
    assert ("ts_in_future", "node-metrics") in r["dead"] and ("ts_too_old", "node-metrics") in r["dead"]
    assert r["clock_resets"] == 1
    assert r["nodes"] <= CAP_NODES and r["weight_series"] <= CAP_NODES
    assert r["app_cap"] >= 20 - CAP_APPS
    assert r["rss_growth_kb"] < 150 * 1024, r["rss_growth_kb"]  # 10k unbounded nodes cost ~660 MB before
    assert r["weight_series_after"] == 0 and r["evicted"] >= CAP_NODES - 10
    assert {"gpu-future", "gpu-jump", "n00000"} <= r["tombstones"]
