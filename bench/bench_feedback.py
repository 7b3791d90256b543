"""The feedback loop on the embedded broker: completion -> prediction-errors latency and join throughput.

    python3 bench/bench_feedback.py [--quick]

1. completion -> prediction-errors: a completion (and its prediction) sent at a random moment; the time
   until a prediction-errors message counting it is read back, at the default 5 s error period
   (goal <= 6 s: one period plus delivery).
2. join throughput: a backlog of N predictions + N completions on 64 nodes (with their metrics) is
   consumed by one worker (a subprocess); completions per second from its first to its last match,
   beside a raw aiokafka consumer reading the same two topics (goal >= 5,000 completions/s).

Drift onset -> promoted model (goal <= 30 s with 50,000 samples) is measured end to end by
``python3 bench/bench_promotion.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aiokafka import AIOKafkaConsumer, TopicPartition  # noqa: E402

from app.cli.processes import ProcessGroup  # noqa: E402
from app.config import Settings  # noqa: E402
from app.contracts import contract  # noqa: E402
from app.kafka.admin import ensure_topics  # noqa: E402
from app.kafka.embedded import EmbeddedBroker  # noqa: E402
from app.sim.scripted import Node, Reader, metric_value, prediction, produce, snapshot, start_worker, task  # noqa: E402

APP = "gCTF"


# -- 1. latency ------------------------------------------------------------------------------------
async def latency(s: Settings, rounds: int) -> list[float]:
    rng = random.Random(1)
    node = Node("lat-1", "Tesla M40", 100.0)
    out: list[float] = []
    async with Reader(s, "prediction-errors") as errors:
        await produce(s, [("node-metrics", snapshot(node, time.time(), rng))])
        for k in range(rounds):
            await asyncio.sleep(rng.uniform(0.0, 5.0))
            now = time.time()
            c = task(f"lat-{k}", APP, node, now, rng)
            await produce(s, [("rtt-predictions", prediction(c["task_id"], APP, node.name, now, 150.0)),
                              ("task-completions", c)])
            sent = time.monotonic()
            seen = len([e for e in errors.values if e["node"] == node.name])
            await errors.wait(lambda v, seen=seen: len([e for e in v if e["node"] == node.name]) > seen, 15.0)
            out.append(time.monotonic() - sent)
            print(f"  latency round {k + 1}/{rounds}: {out[-1]:.2f} s", flush=True)
    return out


# -- 2. throughput ---------------------------------------------------------------------------------
def backlog(n: int) -> list[tuple[str, dict[str, Any]]]:
    rng = random.Random(2)
    nodes = [Node(f"gpu-{i:02d}", "Tesla M40", 100.0 + i) for i in range(64)]
    t0 = time.time() - 30.0
    items: list[tuple[str, dict[str, Any]]] = []
    for k in range(20):
        items += [("node-metrics", snapshot(nd, t0 + k, rng)) for nd in nodes]
    for i in range(n):
        nd = nodes[i % len(nodes)]
        c = task(f"tp-{i}", APP, nd, t0 + 20 + i * 1e-4, rng)
        items.append(("rtt-predictions", prediction(c["task_id"], APP, nd.name, c["started_ts"], 140.0)))
        items.append(("task-completions", c))
    return items


async def raw_consume(s: Settings, n_messages: int) -> float:
    c = AIOKafkaConsumer(bootstrap_servers=s.bootstrap_servers, group_id=None, auto_offset_reset="earliest",
                         enable_auto_commit=False, max_partition_fetch_bytes=4 << 20)
    await c.start()
    tps = [TopicPartition(s.topic(t), p) for t in ("task-completions", "rtt-predictions")
           for p in range(contract(t).partitions)]
    c.assign(tps)
    got, t0 = 0, time.perf_counter()
    try:
        while got < n_messages:
            batch = await c.getmany(timeout_ms=500, max_records=10_000)
            got += sum(len(m) for m in batch.values())
    finally:
        await c.stop()
    return got / (time.perf_counter() - t0)


def worker_rate(url: str, n: int, timeout_s: float) -> float:
    """Completions/s from the last poll that saw no match to the first that saw all ``n`` (a lower bound)."""
    def matched() -> float:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        return metric_value(text, 'rtt_worker_join_total{outcome="matched"}')

    deadline = time.monotonic() + timeout_s
    last_zero = time.monotonic()
    while time.monotonic() < deadline:
        m = matched()
        now = time.monotonic()
        if m == 0:
            last_zero = now
        elif m >= n:
            return n / max(now - last_zero, 1e-9)
        print(f"  worker matched {int(m)}/{n}", flush=True)
        time.sleep(0.1)
    raise RuntimeError(f"worker matched fewer than {n} pairs in {timeout_s}s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (a few tens of seconds, most of it startup)")
    args = ap.parse_args()
    n_pairs = 30_000 if args.quick else 200_000
    rounds = 2 if args.quick else 6
    rows: list[tuple[str, str, str, str]] = []
    broker = EmbeddedBroker().start()
    tmp = Path(tempfile.mkdtemp(prefix="bench-feedback-"))
    try:
        s = Settings.from_env({}, kafka_bootstrap=broker.bootstrap, topic_prefix="bfb-", models_dir=str(tmp / "m"))
        asyncio.run(ensure_topics(s))
        print(f"producing a backlog of {n_pairs} predictions + completions ...", flush=True)
        asyncio.run(produce(s, backlog(n_pairs)))
        raw = asyncio.run(raw_consume(s, 2 * n_pairs))
        with ProcessGroup(tmp / "logs") as group:
            url = start_worker(group, s, RTT_ERROR_PERIOD_S="5")
            rate = worker_rate(url, n_pairs, 300.0)
            lat = asyncio.run(latency(dataclasses.replace(s, error_period_s=5.0), rounds))
        rows.append(("completion -> prediction-errors (5 s period)", f"max {max(lat):.2f} s",
                     f"mean {statistics.mean(lat):.2f} s", "goal <= 6 s"))
        rows.append(("join: completions/s per worker", f"{rate:,.0f}/s",
                     f"raw consume {raw / 2:,.0f} completions/s (ratio {rate / (raw / 2):.3f})", "goal >= 5,000/s"))
    finally:
        broker.stop()
    width = max(len(r[0]) for r in rows)
    print(f"\n{'measure':<{width}}  {'value':>12}  detail")
    for name, value, detail, goal in rows:
        print(f"{name:<{width}}  {value:>12}  {detail}; {goal}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
