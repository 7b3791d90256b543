"""Worker throughput and latency on the embedded broker, beside raw aiokafka consumption (the ceiling).

    python3 bench/bench_worker.py            # 60,000 snapshots of 30 metrics from 500 nodes
    python3 bench/bench_worker.py --quick    # a few seconds
    python3 bench/bench_worker.py --profile var/worker.prof   # cProfile of the worker process

1. ceiling: one aiokafka consumer reads the pre-filled node-metrics topic (no decoding).
2. worker: one ``rttsched worker`` process drains the same amount of pre-filled snapshots; the rate is
   read from its /metrics (``rtt_worker_messages_in_total``) between its first step and the step that reaches
   them all. The worker counts messages when a checkpoint stores them, so the counter moves once per checkpoint:
   this run checkpoints every ``--checkpoint-interval`` (0.1 s; RTT_WORKER_CHECKPOINT_INTERVAL_S, 1 s by
   default), and a drain that ends within one step is reported as too short to measure (raise ``-n``).
3. latency: snapshots produced at a steady rate (ts = produce time) while the worker runs; latency is
   node-features receive time minus the ts of the newest snapshot it includes (p50 / p99).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.cli.processes import ProcessGroup  # noqa: E402
from app.config import Settings  # noqa: E402
from app.kafka.admin import ensure_topics  # noqa: E402
from app.kafka.embedded import EmbeddedBroker, free_port  # noqa: E402

METRICS = [f"{g}_{i}" for g in ("nvidia_smi_utilization_gpu", "pcie_rx_bytes", "cpu_usage_system") for i in range(10)]


def snapshot(i: int, nodes: int, ts: float, rng: np.random.Generator) -> tuple[bytes, bytes]:
    node = f"node-{i % nodes:05d}"
    values = rng.uniform(0, 1e9, len(METRICS)).round(2).tolist()
    v = {"node": node, "ts": ts, "node_class": "gpu", "gpu_model": "Tesla M40", "metrics": dict(zip(METRICS, values))}
    return node.encode(), orjson.dumps(v)


async def fill(s: Settings, n: int, nodes: int) -> float:
    rng = np.random.default_rng(1)
    p = AIOKafkaProducer(bootstrap_servers=s.bootstrap_servers, linger_ms=5, max_batch_size=1 << 20)
    await p.start()
    t0, base = time.perf_counter(), time.time() - 60
    try:
        for i in range(n):
            k, v = snapshot(i, nodes, base + i * 60 / n, rng)
            await p.send(s.topic("node-metrics"), v, key=k)
            if i % 20000 == 0:
                print(f"  produced {i:,}/{n:,}", file=sys.stderr, flush=True)
        await p.flush()
    finally:
        await p.stop()
    return n / (time.perf_counter() - t0)


async def raw_consume(s: Settings, n: int) -> float:
    c = AIOKafkaConsumer(s.topic("node-metrics"), bootstrap_servers=s.bootstrap_servers, auto_offset_reset="earliest",
                         group_id=f"ceiling-{uuid.uuid4().hex[:6]}", max_partition_fetch_bytes=8 << 20)
    await c.start()
    got, t0 = 0, None
    try:
        while got < n:
            batch = await c.getmany(timeout_ms=1000, max_records=10000)
            if t0 is None and batch:
                t0 = time.perf_counter()
            got += sum(len(m) for m in batch.values())
    finally:
        await c.stop()
    return n / (time.perf_counter() - (t0 or time.perf_counter()))


def messages_in(url: str) -> float:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    m = re.search(r'^rtt_worker_messages_in_total\{topic="node-metrics"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


POLL_S = 0.05


def worker_rate(url: str, n: int, timeout_s: float) -> float:
    """Messages/s counted between the first step of ``url``'s counter and the step that reaches ``n``; NaN when
    the two are one step (the whole drain within one count step: nothing to measure it over)."""
    deadline = time.monotonic() + timeout_s
    first: tuple[float, float] | None = None
    last_print = 0.0
    while time.monotonic() < deadline:
        got, now = messages_in(url), time.perf_counter()
        if got > 0 and first is None:
            first = (now, got)
        if got >= n and first is not None:
            if got <= first[1] or now <= first[0]:
                print(f"  {n:,} messages counted in one step: the drain is too short to measure (raise -n)",
                      file=sys.stderr, flush=True)
                return float("nan")
            return (got - first[1]) / (now - first[0])
        if now - last_print > 2:
            print(f"  worker consumed {got:,.0f}/{n:,}", file=sys.stderr, flush=True)
            last_print = now
        time.sleep(POLL_S)
    raise SystemExit(f"worker did not consume {n} messages in {timeout_s}s")


async def latency(s: Settings, rate: float, seconds: float, nodes: int) -> np.ndarray:
    rng = np.random.default_rng(2)
    c = AIOKafkaConsumer(s.topic("node-features"), bootstrap_servers=s.bootstrap_servers, auto_offset_reset="latest")
    await c.start()
    await c.getmany(timeout_ms=500)
    p = AIOKafkaProducer(bootstrap_servers=s.bootstrap_servers, linger_ms=1)
    await p.start()
    lat: list[float] = []
    t_start = time.time()

    async def consume() -> None:
        while time.time() < t_start + seconds + 3:
            batch = await c.getmany(timeout_ms=200)
            now = time.time()
            for msgs in batch.values():
                for m in msgs:
                    ts = orjson.loads(m.value)["ts"]
                    if ts >= t_start:  # features of this run's snapshots, not of the pre-filled backlog
                        lat.append(now - ts)

    task = asyncio.create_task(consume())
    i = 0
    while (elapsed := time.time() - t_start) < seconds:
        while i < elapsed * rate:
            k, v = snapshot(i, nodes, time.time(), rng)
            await p.send(s.topic("node-metrics"), v, key=k)
            i += 1
        await asyncio.sleep(0.005)
    await p.flush()
    await task
    await p.stop()
    await c.stop()
    return np.array(lat)


def run_noop_worker() -> int:
    """A Faust worker that only counts node-metrics events: Faust's own per-event ceiling."""
    import faust

    from app.streams.app import create_app
    from app.streams.context import context_of
    from app.streams.options import WorkerOptions
    from app.streams.topics import contract_topic

    def register_noop(app: faust.App, settings: Settings) -> None:
        counter = context_of(app).metrics.messages_in.labels("node-metrics")

        async def noop(stream: faust.StreamT) -> None:
            async for _ in stream.events():
                counter.inc()

        app.agent(contract_topic(app, settings, "node-metrics"), name="noop")(noop)

    s = Settings.from_env()
    opts = WorkerOptions.from_settings(s, datadir=tempfile.mkdtemp(prefix="noop-faust-"))
    app = create_app(s, id=f"{s.topic_prefix}noop", components=[register_noop], options=opts)
    faust.Worker(app, loglevel="warning", quiet=True, redirect_stdouts=False, override_logging=False)\
        .execute_from_commandline()
    return 0


def start(group: ProcessGroup, name: str, argv: list[str], profile: str = "") -> None:
    import subprocess

    prof = ["-m", "cProfile", "-o", profile] if profile else []
    log = open(group.log_dir / f"{name}.log", "wb")
    group.children[name] = subprocess.Popen([sys.executable, *prof, *argv], env=group.env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
    log.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small run (a few seconds)")
    ap.add_argument("-n", type=int, default=60_000, help="snapshots for the throughput runs")
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--rate", type=float, default=2000.0, help="snapshots/s in the latency run")
    ap.add_argument("--seconds", type=float, default=8.0, help="length of the latency run")
    ap.add_argument("--emit-interval", type=float, default=1.0, help="RTT_FEATURE_EMIT_INTERVAL_S of the worker")
    ap.add_argument("--checkpoint-interval", type=float, default=0.1,
                    help="RTT_WORKER_CHECKPOINT_INTERVAL_S of the worker: its counter moves once per checkpoint")
    ap.add_argument("--profile", default="", help="write a cProfile of the worker process here")
    ap.add_argument("--noop-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.noop_worker:
        return run_noop_worker()
    if args.quick:
        args.n, args.seconds, args.rate = 10_000, 3.0, 1000.0

    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        s = Settings.from_env({}, kafka_bootstrap=broker.bootstrap, topic_prefix=f"b{uuid.uuid4().hex[:8]}-")
        asyncio.run(ensure_topics(s))
        print(f"filling node-metrics with {args.n:,} snapshots ({len(METRICS)} metrics, {args.nodes} nodes)",
              file=sys.stderr)
        produce_rate = asyncio.run(fill(s, args.n, args.nodes))
        ceiling = asyncio.run(raw_consume(s, args.n))

        port = free_port()
        env = {"RTT_KAFKA_BOOTSTRAP": s.bootstrap_servers, "RTT_TOPIC_PREFIX": s.topic_prefix,
               "RTT_METRICS_PORT": str(port), "RTT_FEATURE_EMIT_INTERVAL_S": str(args.emit_interval),
               "RTT_WORKER_CHECKPOINT_INTERVAL_S": str(args.checkpoint_interval)}
        url = f"http://127.0.0.1:{port}/metrics"
        with ProcessGroup(Path(tmp), env) as group:
            start(group, "noop", [__file__, "--noop-worker"])
            group.wait_http("noop", url, timeout_s=60)
            noop = worker_rate(url, args.n, timeout_s=max(120.0, args.n / 500))
            group.stop()
            cmd = ["-m", "app.cli.main", "worker", "--loglevel", "warning", "--datadir", str(Path(tmp) / "faust")]
            start(group, "worker", cmd, args.profile)
            group.wait_http("worker", url.replace("/metrics", "/readyz"), timeout_s=60)  # Faust runs
            rate = worker_rate(url, args.n, timeout_s=max(120.0, args.n / 500))
            lat = asyncio.run(latency(s, args.rate, args.seconds, args.nodes))
        load = os.getloadavg()[0]

    p50, p99 = (np.percentile(lat, [50, 99]) * 1e3) if len(lat) else (float("nan"), float("nan"))
    print(f"\nworker bench: {args.n:,} snapshots x {len(METRICS)} metrics, {args.nodes} nodes, "
          f"emit interval {args.emit_interval:g} s, checkpoint interval {args.checkpoint_interval:g} s, "
          f"1 worker process, load average {load:.1f} on {os.cpu_count()} cpus")
    print(f"{'measure':<44}{'value':>14}{'vs ceiling':>12}")
    print(f"{'raw aiokafka consume (ceiling), msg/s':<44}{ceiling:>14,.0f}{1.0:>12.3f}")
    print(f"{'producer (fill), msg/s':<44}{produce_rate:>14,.0f}{produce_rate / ceiling:>12.3f}")
    print(f"{'faust no-op agent (counts events), msg/s':<44}{noop:>14,.0f}{noop / ceiling:>12.3f}")
    print(f"{'worker node-metrics -> node-features, msg/s':<44}{rate:>14,.0f}{rate / ceiling:>12.3f}"
          f"   ({rate / noop:.2f} of the no-op agent)")
    print(f"{'goal, msg/s':<44}{5000:>14,.0f}{5000 / ceiling:>12.3f}")
    print(f"{f'latency at {args.rate:,.0f}/s: p50 ms':<44}{p50:>14.1f}")
    print(f"{f'latency at {args.rate:,.0f}/s: p99 ms':<44}{p99:>14.1f}   ({len(lat):,} node-features)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
