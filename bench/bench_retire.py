"""Memory an app leaves behind once it is gone: the worker's per-app state and the trainer's sample history,
after N apps came and went, with the release on and off.

    python3 bench/bench_retire.py            # 10 and 30 apps, under a minute
    python3 bench/bench_retire.py --quick    # 5 and 10 apps, fewer nodes and samples, 10,000 rows

**Worker** (in process: the real node-features, feedback and eviction components on a manual clock, a
directory registry). Apps ``pipe-v0``, ``pipe-v1``, … run one after the other, as pipeline versions with
their own app label do: each gets a model (loaded, as from model-updates), then ``--periods`` error
periods of one task per node on ``--nodes`` GPU nodes whose metrics move (pairs into the trackers,
samples, DWA windows, a node-weights period predicting every loaded model on fresh rows, a checkpoint).
The nodes stay; an app falls silent when the next starts, and the eviction (``RTT_NODE_EVICT_AFTER_S`` =
one app's run) runs every period (the join's entries, per task, live two periods). Held: tracemalloc's
current size (numpy's arrays included) after the last app has gone, over the same worker's size once a
first app (``warm-up``, not counted) has run and the nodes' windows hold their whole history.

**Trainer**: ``--samples`` training samples of ``--features`` metric features per app's model key through
:meth:`~app.trainer.history.SampleHistory.add`, each key's after the previous went idle
(``RTT_TRAINER_KEY_IDLE_S``), :meth:`~app.trainer.service.TrainerService.drop_idle` at each new key. Held:
the history's tracemalloc size after the last key went idle.

*release off* is what the worker and trainer did before: the eviction freed the app's place under the cap
and its two error series only (``FeedbackLoop.forget_apps`` made a no-op here), and the trainer kept every
key's history (``drop_idle`` not called). Each cell is measured in a fresh interpreter.

**Changelog rows** (``--rows``, 100,000 by default): what one row of a table's in-memory data costs (the
join's entries: a key and a 34-byte orjson value), kept as the table keeps it
(:func:`~app.streams.changelog.compact`: a copy of its own size) beside orjson's output kept as it is (what
the soak found: orjson returns its bytes in a buffer of 4 KB or more). tracemalloc's size over the rows.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PERIOD_S = 5.0
GPUS = ("Tesla K20c", "Tesla M40", "NVIDIA GeForce RTX 4090")
MODEL_FEATURES = ["nvidia_smi_utilization_gpu__mean", "cpu_iowait__mean", "hw_gpu_fp32_tflops"]


def booster_blob() -> bytes:
    """One small real model (100 trees), saved under every app's key."""
    import numpy as np
    import xgboost

    from app.model.train import booster_to_bytes

    rng = np.random.default_rng(0)
    X = np.column_stack([rng.uniform(0, 1, 500), rng.uniform(0, 5, 500),
                         rng.choice([3.52, 6.84, 82.6], 500)]).astype(np.float32)
    y = 100.0 + 400.0 * X[:, 0] + 20.0 * X[:, 1] + 2000.0 / X[:, 2]
    b = xgboost.train({"max_depth": 6, "eta": 0.1, "nthread": 1},
                      xgboost.DMatrix(X, label=y, feature_names=MODEL_FEATURES), 100)
    return booster_to_bytes(b, "ubj")


def worker_held(apps: int, nodes: int, periods: int, release: bool) -> dict[str, Any]:
    from app.clock import ManualClock
    from app.config import Settings
    from app.contracts import decode, encode
    from app.registry.directory import DirectoryModelStore
    from app.streams.app import create_app
    from app.streams.context import context_of
    from app.streams.feedback_state import FeedbackLoop
    from app.streams.feedback_weights import weights_values
    from app.streams.options import WorkerOptions

    class Sender:
        def add(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
            pass

    rng = random.Random(1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-retire-"))
    blob = booster_blob()
    after_s = periods * PERIOD_S
    settings = Settings(metrics_port=0, models_dir=str(tmp / "models"), node_evict_after_s=after_s,
                        join_ttl_s=2 * PERIOD_S)  # the join's entries, per task, live two periods: not per app
    store = DirectoryModelStore(tmp / "models")
    clock = ManualClock(1_000_000.0)
    app = create_app(settings, id="bench-retire", clock=clock,
                     options=dataclasses.replace(WorkerOptions(), datadir=str(tmp / "faust")))
    ctx = context_of(app)
    loop: FeedbackLoop = ctx.handles["feedback"]
    loop.models._store = store
    feats = ctx.handles["node_features"]
    feats.intake.sender = loop.intake.sender = Sender()  # type: ignore[union-attr]
    if not release:
        loop.forget_apps = lambda apps: {}  # type: ignore[method-assign]
    on_metrics = feats.intake.handlers["node-metrics"]
    handlers = loop.intake.handlers  # type: ignore[union-attr]
    names = [f"gpu-{i}" for i in range(nodes)]
    evict = ctx.handles["evict"]
    tasks = 0

    async def write(rows: Any, **_kw: Any) -> int:  # the feedback table's changelog (no broker here)
        return len(list(rows))

    loop.table.write = write  # type: ignore[method-assign]

    async def period(app_name: str | None) -> None:
        nonlocal tasks
        now = clock.now()
        for n in names:
            snap = {"node": n, "ts": now, "node_class": "gpu", "gpu_model": GPUS[hash(n) % 3],
                    "metrics": {"nvidia_smi_utilization_gpu": rng.random(), "cpu_iowait": rng.uniform(0, 5)}}
            on_metrics(decode("node-metrics", encode("node-metrics", snap)), 0)
            if app_name is None:
                continue
            tasks += 1
            t, rtt = f"t{tasks}", rng.uniform(100.0, 600.0)
            p = {"task_id": t, "app": app_name, "node": n, "ts": now, "predicted_rtt_ms": rtt * 1.1,
                 "model_version": 1}
            c = {"task_id": t, "app": app_name, "node": n, "submitted_ts": now - 1.0, "started_ts": now - 0.9,
                 "finished_ts": now - 0.9 + rtt / 1000.0, "rtt_ms": rtt, "status": "ok"}
            handlers["rtt-predictions"](decode("rtt-predictions", encode("rtt-predictions", p)), 0)
            handlers["task-completions"](decode("task-completions", encode("task-completions", c)), 0)
        for n in names:  # the period's close, as the error timer does it
            t = loop.trackers.get(n)
            if t is not None:
                for a, r in t.close(now).items():
                    feats.store.states[n].set_window(r.window_s, a)
        weights_values(loop, now)  # every loaded model predicts every node
        await loop.checkpoint()
        evict()
        clock.advance(PERIOD_S)

    async def app_runs(name: str) -> None:
        key = f"{name}:gpu"
        rec = store.save(key, blob, fmt="ubj", features=MODEL_FEATURES, params={}, metrics={}, n_samples=500)
        store.promote(key, rec.version)
        await loop.models.apply({"model_key": key, "version": rec.version, "sha256": rec.sha256})
        for _ in range(periods):
            await period(name)

    async def run() -> int:
        await app_runs("warm-up")  # what the first model load and predictions compile
        for _ in range(int(settings.feature_history_s / PERIOD_S) + 1):  # the nodes' windows fill their history
            await period(None)
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        for i in range(apps):
            await app_runs(f"pipe-v{i}")
        for _ in range(periods + 1):  # the last app goes silent too
            await period(None)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        return held

    started = time.perf_counter()
    try:
        held = asyncio.run(run())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"held": held, "models": len(loop.models.models), "tracked": len(loop.apps() - {"warm-up"}),
            "seconds": time.perf_counter() - started}


def trainer_held(keys: int, samples: int, features: int, release: bool) -> dict[str, Any]:
    from app.config import Settings
    from app.trainer.service import TrainerService

    idle_s = 3600.0
    service = TrainerService(Settings(), key_idle_s=idle_s)
    rng = random.Random(2)
    started = time.perf_counter()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    now = 0.0
    for k in range(keys):
        key = f"pipe-v{k}:gpu"
        now += idle_s  # the previous key has been idle this long
        if release:
            service.drop_idle(now)
        for i in range(samples):
            service.history.add({
                "model_key": key, "task_id": f"t{i}", "node": f"gpu-{i % 50}", "node_class": "gpu",
                "gpu_model": GPUS[i % 3], "started_ts": 1_700_000_000.0 + i, "rtt_ms": rng.uniform(100.0, 600.0),
                "input_size_mb": 64.0, "features": {f"m{j}__mean": rng.random() for j in range(features)}}, now)
    now += idle_s
    if release:
        service.drop_idle(now)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    service._executor.shutdown(wait=True)
    return {"held": held, "models": 0, "tracked": len(service.history.keys()), "seconds": time.perf_counter() - started}


def rows_held(rows: int, copied: bool) -> dict[str, Any]:
    """Bytes held by ``rows`` changelog rows in a table's data: copied as the table does, or orjson's output."""
    import orjson

    from app.streams.changelog import compact

    started = time.perf_counter()
    data: dict[bytes, bytes] = {}
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(rows):
        value = orjson.dumps({"since": 1_700_000_000.0 + i, "done": True})
        data[f"0|j|gpu-{i % 50}|task-{i}".encode()] = compact(value) if copied else value
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return {"held": held, "models": 0, "tracked": len(data), "seconds": time.perf_counter() - started}


def cell(args: argparse.Namespace, what: str, n: int, release: bool) -> dict[str, Any]:
    """One measurement in a fresh interpreter (nothing of another cell's allocations or compiled code)."""
    cmd = [sys.executable, __file__, "--cell", json.dumps({"what": what, "n": n, "release": release,
                                                           "nodes": args.nodes, "periods": args.periods,
                                                           "samples": args.samples, "features": args.features})]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def run_cell(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["what"] == "rows":
        return rows_held(spec["n"], spec["release"])
    if spec["what"] == "worker":
        return worker_held(spec["n"], spec["nodes"], spec["periods"], spec["release"])
    return trainer_held(spec["n"], spec["samples"], spec["features"], spec["release"])


def mib(b: float) -> str:
    return f"{b / 2**20:,.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="5 and 10 apps, 10 nodes, 500 samples a key")
    p.add_argument("--apps", type=int, nargs="+", default=None, help="apps that come and go (default 10 30)")
    p.add_argument("--nodes", type=int, default=20, help="GPU nodes of the worker")
    p.add_argument("--periods", type=int, default=6, help="error periods each app runs")
    p.add_argument("--samples", type=int, default=2_000, help="training samples per model key")
    p.add_argument("--features", type=int, default=30, help="metric features per sample")
    p.add_argument("--rows", type=int, default=100_000, help="changelog rows kept in a table's memory")
    p.add_argument("--cell", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.cell is not None:
        print(json.dumps(run_cell(json.loads(args.cell))))
        return 0
    if args.quick:
        args.nodes, args.samples, args.rows = 10, 500, 10_000
    counts = args.apps or ([5, 10] if args.quick else [10, 30])
    print(f"worker: {args.nodes} GPU nodes, {args.periods} periods of {PERIOD_S:.0f} s per app, one model per app"
          f" (100 trees, depth 6); trainer: {args.samples:,} samples x {args.features} features per key")
    print()
    print("| held after N apps came and went | N | release off (MiB) | release on (MiB) | off / on |"
          " apps still held (off → on) | s |")
    print("|---|---|---|---|---|---|---|")
    for what, label in (("worker", "worker: trackers, samples, windows, models"), ("trainer", "trainer: history")):
        for n in counts:
            off, on = cell(args, what, n, False), cell(args, what, n, True)
            ratio = off["held"] / on["held"] if on["held"] > 0 else float("inf")
            print(f"| {label} | {n} | {mib(off['held'])} | {mib(on['held'])} | {ratio:,.1f} |"
                  f" {off['tracked']} → {on['tracked']} | {off['seconds'] + on['seconds']:.1f} |", flush=True)
    as_is, copied = cell(args, "rows", args.rows, False), cell(args, "rows", args.rows, True)
    print()
    print("| changelog rows kept in a table's memory | rows | orjson's output kept (B/row) | copied, as the table"
          " keeps them (B/row) | kept / copied | held (MiB, kept → copied) |")
    print("|---|---|---|---|---|---|")
    print(f"| the join's entries: key + 34-byte value | {args.rows:,} | {as_is['held'] / args.rows:,.0f} |"
          f" {copied['held'] / args.rows:,.0f} | {as_is['held'] / copied['held']:,.1f} |"
          f" {mib(as_is['held'])} → {mib(copied['held'])} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
