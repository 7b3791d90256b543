"""The worker-process scenarios of the fault stack: SIGKILL right at period close, hostile input.

Each runs a worker subprocess on the given settings' broker and returns a :class:`fault_stack.Outcome` and
what a test asserts on (tests and ``bench/bench_chaos.py`` share them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from fault_stack import (
    APP,
    Outcome,
    counted,
    metric,
    scrape,
    wait_for,
)

from app.cli.processes import ProcessGroup
from app.config import Settings
from app.contracts import contract, encode
from app.kafka.client import client_options
from app.sim.scripted import Reader, prediction, produce, start_worker

# -- SIGKILL right at period close ------------------------------------------------------------------------
KILL_NODES = [f"gpu-k{i:03d}" for i in range(300)]


def kill_wave(k: int, t0: float) -> list[tuple[str, dict[str, Any]]]:
    """One pair per node: its prediction, then its completion."""
    rng = random.Random(k)
    items: list[tuple[str, dict[str, Any]]] = []
    for n in KILL_NODES:
        tid = f"w{k}-{n}"
        rtt = rng.uniform(100.0, 300.0)
        items.append(("rtt-predictions", prediction(tid, APP, n, t0, rtt * 1.1)))
        items.append(("task-completions", {"task_id": tid, "app": APP, "node": n, "submitted_ts": t0 - 0.01,
                                           "started_ts": t0, "finished_ts": t0 + rtt / 1000, "rtt_ms": rtt,
                                           "status": "ok"}))
    return items


async def _one_life(s: Settings, group: ProcessGroup, name: str, waves: range, t0: float,
                    errors: Reader, kill: bool) -> float:
    """A worker's life: start it, feed ``waves``; with ``kill``, SIGKILL it the moment the first message of a
    period arrives (the rest of that period is being sent). Returns when it was killed."""
    start_worker(group, s, name)
    pid = group.children[name].pid
    for k in waves:
        await produce(s, kill_wave(k, t0))
        await asyncio.sleep(0.3)
    if not kill:
        return 0.0
    before = len(errors.values)
    while len(errors.values) == before:
        await asyncio.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    group.children.pop(name).wait(10)
    return time.monotonic()


async def period_kill(s: Settings, root: Path, waves: int = 12) -> tuple[Outcome, list[dict[str, Any]]]:
    """300 nodes' pairs; the worker SIGKILLed twice right at period close. Lost / twice = pairs never / more
    than once in prediction-errors; recover = from the second kill to the last pair reported."""
    async with Reader(s, "prediction-errors") as errors:
        errors.poll_ms = 20
        with ProcessGroup(root) as group:
            third = waves - 2 * (waves // 3)
            await _one_life(s, group, "first", range(0, waves // 3), time.time(), errors, kill=True)
            killed = await _one_life(s, group, "second", range(waves // 3, 2 * (waves // 3)), time.time(), errors,
                                     kill=True)
            await _one_life(s, group, "third", range(waves - third, waves), time.time(), errors, kill=False)
            total = waves * len(KILL_NODES)
            await errors.wait(lambda v: counted(v) >= total, 90.0, "every pair reported")
            recover = time.monotonic() - killed
            await asyncio.sleep(3 * s.error_period_s)  # a repeat would show up by now
            dead = [n for n, p in group.children.items() if p.poll() is not None]
        values = list(errors.values)
    pairs = counted(values)
    idents = [(v["node"], v["ts"]) for v in values]
    return Outcome("worker SIGKILLed right at period close (twice)", len(dead), max(0, total - pairs),
                   max(0, pairs - total) + len(idents) - len(set(idents)), recover,
                   f"{total} pairs on {len(KILL_NODES)} nodes, {len(values)} messages"), values


# -- hostile input -------------------------------------------------------------------------------------------
CAP_NODES, CAP_APPS = 1000, 8
NAMES = 10_000  # node names sent at once


def snap(node: str, ts: float, util: float = 0.3) -> dict[str, Any]:  # GPU utilisation 0..1, as the bridge sends it
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


async def flood_names(s: Settings, url: str, pid: int, cap: int,
                      then: list[tuple[str, dict[str, Any]]] | None = None) -> tuple[int, int]:
    """:data:`NAMES` node names at once on node-metrics (then ``then``) to the worker at ``url`` (process ``pid``)
    holding at most ``cap`` nodes: its RSS in kB before the names, and its growth once every name is held or a
    dead letter (``node_cap``), a node-weights period later (every held node in it)."""
    rss0 = rss_kb(pid)
    t = time.time()
    await produce(s, [("node-metrics", snap(f"n{i:05d}", t)) for i in range(NAMES)])
    if then:
        await produce(s, then)
    if cap < NAMES:
        await wait_for(lambda: metric(scrape(url), "rtt_worker_dead_letters_total", topic="node-metrics",
                                      reason="node_cap") >= NAMES - cap, 60, "node_cap dead letters")
    else:
        await wait_for(lambda: metric(scrape(url), "rtt_worker_nodes") >= NAMES, 120, "every name held")
    await asyncio.sleep(2.5)  # a node-weights period with every held node in it
    return rss0, rss_kb(pid) - rss0


async def names_uncapped(s: Settings, root: Path) -> dict[str, float]:
    """What the cap saves: :func:`hostile_input`'s names, measured the same way (:func:`flood_names`), by a worker
    whose node cap is raised to hold them all (its own broker prefix in ``s``; nodes evicted after the default
    silence, so none leaves while the names are read)."""
    with ProcessGroup(root) as group:
        url = start_worker(group, s, "worker", RTT_WORKER_MAX_NODES=str(NAMES), RTT_WORKER_MAX_APPS=str(CAP_APPS))
        rss0, growth = await flood_names(s, url, group.children["worker"].pid, NAMES)
        return {"nodes": metric(scrape(url), "rtt_worker_nodes"), "rss_before_kb": rss0, "rss_growth_kb": growth}


async def hostile_input(s: Settings, root: Path) -> tuple[Outcome, dict[str, Any]]:
    """Keys that lie, far-future / far-past timestamps, a clock jump, 10k node names, 20 apps, then silence."""
    with ProcessGroup(root) as group:
        url = start_worker(group, s, "worker", RTT_WORKER_MAX_NODES=str(CAP_NODES), RTT_WORKER_MAX_APPS=str(CAP_APPS),
                           RTT_NODE_EVICT_AFTER_S="6")
        pid = group.children["worker"].pid

        async def scenario() -> dict[str, Any]:
            async with Reader(s, "dead-letters") as dead, RawReader(s, "node-features") as feats, \
                    RawReader(s, "node-weights") as weights:
                now = time.time()
                # keys that lie
                await send_raw(s, "node-metrics", [(b"gpu-liar-2", snap("gpu-liar-1", now))])
                await send_raw(s, "task-completions", [(None, completion("t-nokey", "gpu-liar-1", "gCTF"))])
                # far future, far past, then valid snapshots of the same node
                await produce(s, [("node-metrics", snap("gpu-future", 9.9e10)),
                                  ("node-metrics", snap("gpu-future", now - 2 * 86_400))])
                valid_at = time.monotonic()
                await produce(s, [("node-metrics", snap("gpu-future", time.time() + 0.1 * k, util=0.55))
                                  for k in range(5)])
                # a node's clock 200 s ahead (within the skew), then right again
                await produce(s, [("node-metrics", snap("gpu-jump", time.time() + 200 + 0.1 * k)) for k in range(3)])
                await asyncio.sleep(1.5)
                await produce(s, [("node-metrics", snap("gpu-jump", time.time() + 0.1 * k, util=0.77))
                                  for k in range(3)])
                await wait_for(lambda: any(k == "gpu-future" and v and v["ts"] < now + 60 for k, v in feats.records),
                             30, "node-features of gpu-future after its far-future snapshot")
                future_recover_s = time.monotonic() - valid_at
                await wait_for(lambda: any(k == "gpu-jump" and v and v["ts"] < now + 60 for k, v in feats.records),
                             30, "node-features of gpu-jump after its clock came back")
                text = scrape(url)
                out: dict[str, Any] = {"clock_resets": metric(text, "rtt_worker_clock_resets_total"),
                                       "future_recover_s": future_recover_s}
                # 10,000 node names, and 20 app names
                apps = [("task-completions", completion(f"t-app-{a}", "gpu-future", f"app{a:02d}")) for a in range(20)]
                rss0, growth = await flood_names(s, url, pid, CAP_NODES, then=apps)
                text = scrape(url)
                out.update(nodes=metric(text, "rtt_worker_nodes"), rss_before_kb=rss0, rss_growth_kb=growth,
                           weight_series=text.count("rtt_worker_node_weight{"),
                           app_cap=metric(text, "rtt_worker_dead_letters_total", reason="app_cap"))
                # silence: every node is evicted
                await wait_for(lambda: metric(scrape(url), "rtt_worker_nodes") == 0, 40, "every node evicted")
                await asyncio.sleep(1.0)
                text = scrape(url)
                last = {k: v for k, v in feats.records} | {f"w:{k}": v for k, v in weights.records}
                out["alive_after"] = sorted(k for k, v in last.items() if v is not None)
                out.update(weight_series_after=text.count("rtt_worker_node_weight{"),
                           evicted=metric(text, "rtt_worker_evicted_total", kind="node"),
                           tombstones={k for k, v in feats.records if v is None})
                out["dead"] = {(d["reason"], d["topic"].removeprefix(s.topic_prefix)) for d in dead.values}
                out["dead_n"] = len(dead.values)
                return out

        r = await scenario()
        r["dead_processes"] = [n for n, p in group.children.items() if p.poll() is not None]
    dead_letters = {"key_mismatch", "ts_in_future", "ts_too_old"} - {reason for reason, _ in r["dead"]}
    lost = len(dead_letters) + int(r["clock_resets"] != 1) + int(r["weight_series_after"] != 0) + len(r["alive_after"])
    return Outcome("hostile input: lying keys, ts 9.9e10 / 2 days old, clock jump, 10k node names",
                   len(r["dead_processes"]), lost, 0, r["future_recover_s"],
                   f"held {r['nodes']:.0f} of {NAMES:,} names (cap {CAP_NODES}), RSS +{r['rss_growth_kb'] / 1024:.0f}"
                   f" MB on {r['rss_before_kb'] / 1024:.0f} MB before the names (+"
                   f"{100 * r['rss_growth_kb'] / max(r['rss_before_kb'], 1):.0f} %),"
                   f" {r['weight_series']} weight series, then all evicted ({r['evicted']:.0f})"), r
