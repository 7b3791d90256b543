"""Extender latency: prioritize in process (16 / 64 / 512 nodes) and over HTTP at 64 nodes.

Baseline, side by side: the same answer computed with one ``xgboost.Booster.inplace_predict`` call per
node (what a naive extender does), as a ratio. Goal: p99 <= 5 ms at 200 requests/s over HTTP.

    python3 bench/bench_extender.py            # full run (~1 min)
    python3 bench/bench_extender.py --quick    # a few seconds

The HTTP server runs in a child process pinned to one core (when the machine has two or more), the client
in this process on another; both on 127.0.0.1 only. The model is a real XGBoost regressor with the GPU
preset (150 trees, depth 8) over 46 features; the payloads are full v1.Pod / v1.NodeList objects as
kube-scheduler sends them (tests/fixtures/kube/).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.clock import ManualClock  # noqa: E402
from app.config import Settings  # noqa: E402
from app.extender.options import ExtenderOptions  # noqa: E402
from app.extender.protocol import parse_args  # noqa: E402
from app.extender.service import ExtenderService  # noqa: E402
from app.features.hardware import HARDWARE_FEATURES, hardware_features  # noqa: E402
from app.features.vector import row  # noqa: E402
from app.scheduler.policy import Policy  # noqa: E402
from app.scheduler.scoring import score_nodes  # noqa: E402

KUBE = ROOT / "tests" / "fixtures" / "kube"
METRICS = ("nvidia_smi_utilization_gpu", "nvidia_smi_memory_used", "cuda_stream_active", "pcie_rx_bytes",
           "cpu_usage_system", "cpu_iowait", "memory_cache_usage", "gpu_mem_bw_util")
AGGS = ("mean", "min", "max", "last", "std")
NODE_FEATURES = tuple(f"{m}__{a}" for m in METRICS for a in AGGS)
FEATURES = (*NODE_FEATURES, *HARDWARE_FEATURES, "task_input_size_mb")
GPUS = ("NVIDIA GeForce RTX 4090", "Tesla M40", "Tesla K20c")
NOW = 1_715_678_500.0


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def train(seed: int = 0) -> Any:
    """A GPU-preset XGBoost model of RTT over FEATURES (synthetic data, fixed seed)."""
    from app.model.train import train_model

    rng = np.random.default_rng(seed)
    n = 3000
    X = rng.uniform(0, 1, (n, len(FEATURES))).astype(np.float32)
    y = 100 + 800 * X[:, 0] + 300 * X[:, 7] * X[:, 12] + 50 * X[:, -1] + rng.normal(0, 10, n)
    return train_model(X, y, FEATURES, "gpu", max_samples=n).booster


class DiscardSink:
    def __init__(self) -> None:
        self.count = 0

    async def send(self, key: bytes, value: bytes) -> None:
        self.count += 1

    async def close(self) -> None:
        return None


def node_names(n: int) -> list[str]:
    return [f"gpu-{i:04d}" for i in range(n)]


def node_values(n: int, seed: int = 1) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(seed)
    return {name: {f: float(rng.uniform(0, 1)) for f in NODE_FEATURES} for name in node_names(n)}


def make_service(booster: Any, n: int) -> ExtenderService:
    from app.model.fast import FastPredictor

    settings = Settings.from_env({})
    service = ExtenderService(settings, ExtenderOptions.from_settings(settings), policy=Policy(),
                              clock=ManualClock(NOW), sink=DiscardSink(), kafka=False, redis=False)
    for i, (name, feats) in enumerate(node_values(n).items()):
        service.builder.apply_node_features({"node": name, "ts": NOW - 1, "node_class": "gpu",
                                             "gpu_model": GPUS[i % 3], "window_s": 30.0, "count": 30,
                                             "features": feats})
        service.builder.apply_node_weights({"node": name, "ts": NOW - 1, "weight": 0.8, "predicted_rtt_ms": {},
                                            "stale": False})
    service.builder.set_model("gCTF:gpu", 1, FastPredictor.from_booster(booster, FEATURES))
    service.rebuild(force=True)
    return service


def payload(n: int, mode: str = "nodes") -> bytes:
    """ExtenderArgs for the gCTF fixture pod over n nodes (full Node objects, cloned from the fixtures)."""
    pod = json.loads((KUBE / "pod_gctf.json").read_text())
    if mode == "names":
        return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": node_names(n)})
    template = json.loads((KUBE / "nodelist.json").read_text())["items"][0]
    items = []
    for name in node_names(n):
        node = copy.deepcopy(template)
        node["metadata"]["name"] = name
        node["metadata"]["labels"]["kubernetes.io/hostname"] = name
        items.append(node)
    return orjson.dumps({"Pod": pod, "Nodes": {"metadata": {"resourceVersion": "1"}, "items": items},
                         "NodeNames": None})


def pct(samples: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples) * 1000.0, q))


def in_process(service: ExtenderService, body: bytes, iters: int) -> list[float]:
    """Seconds per prioritize: parse + decide + encode, as the handler does (no HTTP)."""
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        orjson.dumps(service.prioritize(parse_args(body)))
        out.append(time.perf_counter() - t0)
        service.assumed.forget("0b7d3f52-91c4-4a7e-bb0e-2f5e4d6c8a10")
    return out


def baseline(booster: Any, n: int, body: bytes, iters: int) -> tuple[list[float], list[int]]:
    """The same scores with one Booster.inplace_predict per node."""
    values = node_values(n)
    out, scores = [], []
    for _ in range(iters):
        t0 = time.perf_counter()
        args = parse_args(body)
        rtts = []
        for i, name in enumerate(args.node_names):
            feats = {**values[name], **hardware_features("gpu", GPUS[i % 3]), "task_input_size_mb": 512.0}
            x = row(feats, FEATURES).reshape(1, -1)
            rtts.append(float(booster.inplace_predict(x)[0]))
        scores = score_nodes(rtts, [0.8] * len(rtts)).tolist()
        orjson.dumps([{"Host": h, "Score": s} for h, s in zip(args.node_names, scores, strict=True)])
        out.append(time.perf_counter() - t0)
    return out, scores


# ---------------------------------------------------------------- HTTP
def serve(port: int, n: int) -> None:
    from aiohttp import web

    from app.extender.server import build_app

    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {0})
    service = make_service(train(), n)
    app = build_app(service)
    gc.freeze()  # as `rttsched extender` does
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


async def http_phase(
    port: int, body: bytes, rate: float, seconds: float, concurrency: int,
) -> tuple[list[float], float]:
    import aiohttp

    url = f"http://127.0.0.1:{port}/prioritize"
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        async def one() -> float:
            t0 = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as resp:
                await resp.read()
                assert resp.status == 200, resp.status
            return time.perf_counter() - t0

        for _ in range(50):  # warm-up: connections, kernels
            await one()
        if rate > 0:  # open loop at a fixed rate
            total = int(rate * seconds)
            start = time.perf_counter()
            tasks = []
            for i in range(total):
                delay = start + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(one()))
            lat = await asyncio.gather(*tasks)
            return list(lat), total / (time.perf_counter() - start)
        done: list[float] = []  # closed loop: as fast as the server answers
        stop = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < stop:
                done.append(await one())

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done, len(done) / (time.perf_counter() - start)


def server_histogram(port: int) -> dict[float, float]:
    """Cumulative bucket counts of rtt_extender_request_seconds{verb="prioritize"} (upper bound -> count)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:  # noqa: S310
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("rtt_extender_request_seconds_bucket") and 'verb="prioritize"' in line:
            le = line.split('le="')[1].split('"')[0]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def histogram_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """The smallest bucket bound holding a fraction q of the requests between two scrapes."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    for b, c in zip(bounds, counts, strict=True):
        if total and c >= q * total:
            return b
    return float("nan")


def wait_ready(port: int, timeout_s: float = 120.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:  # noqa: S310
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("bench server did not become ready")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small iteration counts (a few seconds)")
    p.add_argument("--serve", nargs=2, type=int, metavar=("PORT", "NODES"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        serve(*a.serve)
        return 0
    iters = 50 if a.quick else 1000
    log("training the benchmark model (GPU preset)")
    booster = train()
    booster.set_param({"nthread": 1})  # the baseline on one core, like the extender
    rows = []
    for n in (16, 64, 512):
        log(f"in process, {n} nodes: {iters} x extender, then the per-node inplace_predict baseline")
        service = make_service(booster, n)
        body = payload(n)
        gc.freeze()  # as `rttsched extender` does after start
        ours = in_process(service, body, iters)
        names_body = payload(n, "names")
        ours_names = in_process(service, names_body, iters)
        base_iters = 3 if a.quick else max(5, 2000 // n)
        base, base_scores = baseline(booster, n, body, base_iters)
        our_scores = [r["Score"] for r in service.prioritize(parse_args(body))]
        differ = sum(x != y for x, y in zip(our_scores, base_scores, strict=True))
        same = "yes" if not differ else f"no ({differ} differ)"
        rows.append((n, pct(ours, 50), pct(ours, 99), pct(ours_names, 50), pct(ours_names, 99), pct(base, 50),
                     pct(base, 99), pct(base, 50) / pct(ours, 50), same))
    print("\nprioritize in process (parse + predict + score + encode); baseline = one inplace_predict per node")
    print(f"{'nodes':>6} {'Nodes p50':>9} {'Nodes p99':>9} {'Names p50':>9} {'Names p99':>9} "
          f"{'base p50':>9} {'base p99':>9} {'speed-up':>9}  same answer")
    for n, p50, p99, n50, n99, b50, b99, ratio, same in rows:
        print(f"{n:>6} {p50:>9.3f} {p99:>9.3f} {n50:>9.3f} {n99:>9.3f} {b50:>9.3f} {b99:>9.3f} {ratio:>8.1f}x  {same}")
    print("(ms; Nodes = full NodeList payload, Names = NodeNames payload; speed-up = base p50 / Nodes p50)")

    from app.kafka.embedded import free_port

    port = free_port()
    seconds = 2.0 if a.quick else 10.0
    log(f"HTTP: starting the extender (64 nodes) on 127.0.0.1:{port}")
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "64"])
    table = []
    try:
        wait_ready(port)
        if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2:
            os.sched_setaffinity(0, {1})
        for mode in ("nodes", "names"):
            body = payload(64, mode)
            log(f"HTTP {mode}: open loop at 200 req/s for {seconds:.0f} s")
            before = server_histogram(port)
            lat, achieved = asyncio.run(http_phase(port, body, 200.0, seconds, 1))
            server_p99 = histogram_quantile(before, server_histogram(port), 0.99)
            log(f"HTTP {mode}: closed loop, 4 connections, {seconds:.0f} s")
            lat_max, rps = asyncio.run(http_phase(port, body, 0.0, seconds, 4))
            table.append((mode, len(body), achieved, lat, server_p99, rps, lat_max))
    finally:
        proc.terminate()
        proc.wait(10)
    print("\nHTTP /prioritize, 64 nodes, server on one core (client-observed; server p99 = its own histogram)")
    print(f"{'payload':<22} {'load':<16} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'server p99':>11}")
    for mode, size, achieved, lat, server_p99, rps, lat_max in table:
        label = f"{'NodeList' if mode == 'nodes' else 'NodeNames'} {size / 1024:.0f} KiB"
        print(f"{label:<22} {'200 req/s':<16} {achieved:>7.0f} {pct(lat, 50):>8.3f} {pct(lat, 99):>8.3f} "
              f"{'<= ' + format(server_p99 * 1000, 'g'):>11}")
        print(f"{'':<22} {'max (closed)':<16} {rps:>7.0f} {pct(lat_max, 50):>8.3f} {pct(lat_max, 99):>8.3f}")
    worst = max(pct(t[3], 99) for t in table)
    print(f"\ngoal p99 <= 5 ms at 200 req/s (client-observed, worst payload): {'met' if worst <= 5.0 else 'NOT met'} "
          f"({worst:.2f} ms); load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
