"""Soak: the whole system at a steady load for a long time; every process's memory must stay flat.

    python3 bench/bench_soak.py [--minutes 30] [--snapshots 2000] [--completions 200] [--warmup 0.33]

Runs the embedded broker, a redis-server, ``rttsched worker``, ``trainer`` and ``extender`` (the same
processes as a deployment), and plays a cluster of ``--nodes`` GPU nodes: ``--snapshots`` node-metrics per
second in all, ``--completions`` tasks per second with one prediction each, apps ``upload``, ``gCTF``,
``Motioncor2``. Every 10 s it samples each process's RSS (``/proc/<pid>/status``) and the rates actually
achieved. After the warm-up (``--warmup``, a fraction of the run) each process's RSS must stay within
±10 % of its value at the end of the warm-up (the goal of the faults issue). Bounded structures fill
during the warm-up: the join buffer (``RTT_JOIN_TTL_S``, 10 min) and the trainer's history
(``RTT_TRAINER_MAX_SAMPLES_PER_KEY`` per key) — a run shorter than the time they take to fill says so.

Prints a table (RSS at the end of the warm-up, min, max, last, change) and writes the RSS curves to
``reports/soak_rss.png``. Progress goes to stderr every minute.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aiokafka import AIOKafkaProducer  # noqa: E402
from fault_stack import RedisServer  # noqa: E402

from app.cli.processes import ProcessGroup  # noqa: E402
from app.config import Settings  # noqa: E402
from app.contracts import encode  # noqa: E402
from app.kafka.admin import ensure_topics  # noqa: E402
from app.kafka.embedded import EmbeddedBroker, free_port  # noqa: E402
from app.streams.app import worker_topics  # noqa: E402

APPS = ("upload", "gCTF", "Motioncor2")
SAMPLE_S = 10.0


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


class Cluster:
    """Keyed, valid messages at the asked rates, produced in per-second bursts."""

    def __init__(self, s: Settings, nodes: int, seed: int = 7) -> None:
        self.s = s
        self.rng = random.Random(seed)
        self.nodes = [f"soak-{'gpu' if i % 4 else 'cpu'}-{i:04d}" for i in range(nodes)]
        self.tasks = 0
        self.sent = 0

    def snapshot(self, node: str, ts: float) -> dict[str, object]:
        gpu = "gpu" in node
        metrics = {"cpu_usage_system": self.rng.uniform(0, 0.5), "cpu_iowait": self.rng.uniform(0, 0.2),
                   "memory_cache_usage": self.rng.uniform(1e9, 4e9)}
        if gpu:
            metrics |= {"nvidia_smi_utilization_gpu": self.rng.uniform(10, 90),
                        "nvidia_smi_memory_used": self.rng.uniform(1e9, 8e9)}
        return {"node": node, "ts": ts, "node_class": "gpu" if gpu else "cpu",
                "gpu_model": "Tesla M40" if gpu else None, "metrics": metrics}

    def task(self, ts: float) -> list[tuple[str, bytes, dict[str, object]]]:
        self.tasks += 1
        node = self.rng.choice(self.nodes)
        app = APPS[self.tasks % len(APPS)]
        rtt = self.rng.uniform(200, 3000)
        tid = f"soak-{self.tasks}"
        pred = {"task_id": tid, "app": app, "node": node, "ts": ts - 1, "predicted_rtt_ms": rtt * 1.1,
                "model_version": None}
        done = {"task_id": tid, "app": app, "node": node, "submitted_ts": ts - 1.2, "started_ts": ts - 1,
                "finished_ts": ts - 1 + rtt / 1000, "rtt_ms": rtt, "status": "ok", "input_size_mb": 64.0}
        return [("rtt-predictions", node.encode(), pred), ("task-completions", node.encode(), done)]

    async def second(self, producer: AIOKafkaProducer, snapshots: int, completions: int, k: int) -> None:
        now = time.time()
        n = len(self.nodes)
        items: list[tuple[str, bytes, dict[str, object]]] = []
        for j in range(snapshots):
            node = self.nodes[(k * snapshots + j) % n]
            items.append(("node-metrics", node.encode(), self.snapshot(node, now + j / max(1, snapshots))))
        for _ in range(completions):
            items += self.task(now)
        for topic, key, value in items:
            await producer.send(self.s.topic(topic), encode(topic, value, check=False), key=key)
        self.sent += len(items)


def plot(series: dict[str, list[tuple[float, float]]], warm_s: float, path: Path) -> None:
    """Our processes on the left, each with its ±10 % band from the end of the warm-up on; the broker (which
    keeps every message in memory, and would flatten the others) on its own axis on the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ours = {k: v for k, v in series.items() if k != "broker"}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    for ax, group in ((axes[0], ours), (axes[1], {k: v for k, v in series.items() if k == "broker"})):
        for name, points in group.items():
            minutes, mb = [t / 60 for t, _ in points], [m for _, m in points]
            (line,) = ax.plot(minutes, mb, label=name)
            after = [m for t, m in points if t >= warm_s]
            if group is ours and after:
                at_warm = after[0]
                ax.fill_between([warm_s / 60, minutes[-1]], 0.9 * at_warm, 1.1 * at_warm,
                                color=line.get_color(), alpha=0.12)
        ax.axvline(warm_s / 60, color="grey", linestyle="--", label="end of warm-up")
        ax.set_xlabel("minutes")
        ax.set_ylabel("RSS (MB)")
        ax.set_ylim(bottom=0)
        ax.legend(loc="lower right", fontsize="small")
    axes[0].set_title("rttsched processes (band: ±10 % of the RSS at the end of warm-up)")
    axes[1].set_title("embedded broker (memory-only)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


async def soak(s: Settings, pids: dict[str, int], args: argparse.Namespace, group: ProcessGroup
               ) -> tuple[dict[str, list[tuple[float, float]]], float, float]:
    cluster = Cluster(s, args.nodes)
    producer = AIOKafkaProducer(bootstrap_servers=s.bootstrap_servers, linger_ms=20, max_batch_size=512 * 1024)
    await producer.start()
    series: dict[str, list[tuple[float, float]]] = {name: [] for name in pids}
    t0 = time.monotonic()
    duration = args.minutes * 60
    next_sample, next_say, k = 0.0, 60.0, 0
    try:
        while (elapsed := time.monotonic() - t0) < duration:
            tick = time.monotonic()
            await cluster.second(producer, args.snapshots, args.completions, k)
            k += 1
            if elapsed >= next_sample:
                group.check()
                for name, pid in pids.items():
                    series[name].append((elapsed, rss_mb(pid)))
                next_sample += SAMPLE_S
            if elapsed >= next_say:
                rss = ", ".join(f"{n} {pts[-1][1]:.0f}" for n, pts in series.items())
                say(f"{elapsed / 60:.0f}/{args.minutes:g} min: {cluster.sent / elapsed:,.0f} msg/s sent; RSS MB {rss}")
                next_say += 60
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        await producer.flush()
    finally:
        await producer.stop()
    elapsed = time.monotonic() - t0
    return series, cluster.sent / elapsed, k / elapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--snapshots", type=int, default=2000, help="node-metrics per second")
    p.add_argument("--completions", type=int, default=200, help="tasks (prediction + completion) per second")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--warmup", type=float, default=1 / 3, help="fraction of the run that is warm-up")
    p.add_argument("--report", type=Path, default=REPO / "reports" / "soak_rss.png")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rtt-soak-") as tmp, EmbeddedBroker() as broker:
        root = Path(tmp)
        (root / "redis").mkdir()
        server = RedisServer(root / "redis", persist=False).start()
        s = Settings.from_env({}, kafka_bootstrap=broker.bootstrap, topic_prefix="soak-", redis_url=server.url,
                              models_dir=str(root / "models"))
        asyncio.run(ensure_topics(s, worker_topics(s)))
        env = {"RTT_KAFKA_BOOTSTRAP": s.bootstrap_servers, "RTT_TOPIC_PREFIX": s.topic_prefix,
               "REDIS_URL": s.redis_url, "RTT_MODELS_DIR": s.models_dir}
        try:
            with ProcessGroup(root / "logs", env) as group:
                wport = free_port()
                group.start("worker", ["worker", "--datadir", str(root / "faust"), "--loglevel", "warning"],
                            env={"RTT_METRICS_PORT": str(wport)})
                group.start("trainer", ["trainer"], env={"RTT_METRICS_PORT": "0"})
                eport = free_port()
                group.start("extender", ["extender", "--host", "127.0.0.1", "--port", str(eport), "--no-publish"])
                group.wait_http("worker", f"http://127.0.0.1:{wport}/readyz", 60)  # running: not waiting for Kafka
                group.wait_http("extender", f"http://127.0.0.1:{eport}/healthz", 60)
                pids = {"broker": broker.pid or 0, **{n: c.pid for n, c in group.children.items()}}
                say(f"soak for {args.minutes:g} min: {args.snapshots} snapshots/s, {args.completions} tasks/s, "
                    f"{args.nodes} nodes; processes {pids}")
                series, rate, ticks = asyncio.run(soak(s, pids, args, group))
                dead = [n for n, c in group.children.items() if c.poll() is not None]
        finally:
            server.stop()
    warm_s = args.minutes * 60 * args.warmup
    la = os.getloadavg()
    print(f"soak {args.minutes:g} min, {rate:,.0f} messages/s sent ({args.snapshots} snapshots/s and {args.completions}"
          f" tasks/s asked), load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f} on {os.cpu_count()} CPUs;"
          f" processes dead: {len(dead)}")
    print(f"| process | RSS MB at {warm_s / 60:.0f} min | min after | max after | last | max change | within 10 % |")
    print("|---|---|---|---|---|---|---|")
    ok = not dead
    for name, points in series.items():
        own = name != "broker"  # the memory-only test broker keeps every message (retention 1 day) by design
        after = [m for t, m in points if t >= warm_s]
        base = next((m for t, m in points if t >= warm_s), float("nan"))
        if not after:
            print(f"| {name} | - | - | - | - | - | run too short |")
            ok = False
            continue
        change = max(abs(max(after) - base), abs(min(after) - base)) / base
        flat = change <= 0.10
        ok = ok and (flat or not own)
        verdict = ("yes" if flat else "NO") if own else "not ours: holds every message"
        print(f"| {name} | {base:.0f} | {min(after):.0f} | {max(after):.0f} | {after[-1]:.0f} | {change * 100:+.1f} % "
              f"| {verdict} |")
    plot(series, warm_s, args.report)
    print(f"RSS curves: {args.report}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
