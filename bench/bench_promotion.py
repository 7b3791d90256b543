"""Drift onset -> promoted model, end to end on the embedded broker (goal <= 30 s with 50,000 samples).

    python3 bench/bench_promotion.py             # 50,000 samples in the key's history, one drift
    python3 bench/bench_promotion.py --quick     # 5,000 samples (the warm-up still takes ~1.5 min)
    python3 bench/bench_promotion.py --trials 3  # three drifts in a row, on three nodes
    python3 bench/bench_promotion.py --retrain-only  # one retrain of the history, by thread count

The real pieces, at their default settings (5 s error period, Page-Hinkley with its level-shift rule,
12 periods of reference, feature selection + XGBoost GPU preset, 2 % champion margin):

* a worker subprocess (``rttsched worker``) joins completions with predictions, sends training-samples,
  prediction-errors, node-weights and retrain-events;
* the trainer (:class:`~app.trainer.service.TrainerService`, in this process, training in its thread)
  holds the key's history: ``--samples`` training-samples produced beforehand (features computed as the
  worker does: the node's window aggregates before each task's start), then every live sample;
* this script plays the cluster and the extender: 4 GPU nodes send metrics every second and run
  ``--rate`` tasks/s each (Poisson); each task gets a prediction (the worker's node-weights
  ``predicted_rtt_ms``, i.e. the model in service) when it starts and its completion when it ends.

The trainer answers a cold-start event with v1 (timed: a retrain of the full history, no champion);
after the worker's detectors have their reference (``--warm-up`` periods) one node's GPU utilisation
goes 20 -> 80 % and its RTT doubles at ``t0``. Timed from ``t0``: the first prediction-errors period
showing it, the drift retrain-event, the model-updates announcement of the new version, the worker
serving it, and the node's error back below 0.15.

``--retrain-only`` times :func:`~app.trainer.pipeline.train_challenger` on the same history in this
process (no broker): XGBoost on every CPU (its own default) against ``default_nthread()``, on an idle
machine and beside a competing process that trains XGBoost on every CPU, with the holdout figures.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import heapq
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.cli.processes import ProcessGroup  # noqa: E402
from app.config import Settings  # noqa: E402
from app.features.window import NodeWindow  # noqa: E402
from app.kafka.admin import ensure_topics  # noqa: E402
from app.kafka.embedded import EmbeddedBroker  # noqa: E402
from app.model.train import default_nthread  # noqa: E402
from app.sim.scripted import Node, Reader, Sender, metric_value, prediction, produce, snapshot, start_worker, task  # noqa: E402
from app.trainer.history import SampleHistory  # noqa: E402
from app.trainer.pipeline import train_challenger  # noqa: E402
from app.trainer.service import TrainerService  # noqa: E402

APP = "gCTF"
KEY = f"{APP}:gpu"
GOAL_S = 30.0
RECOVERED_MAPE = 0.15
DRIFT_UTIL = 80.0  # rtt_ms(): base * (1 + util / 40): 20 % -> 80 % doubles the RTT


def cluster() -> list[Node]:
    return [Node("gpu-a", "Tesla M40", 300.0), Node("gpu-b", "NVIDIA GeForce RTX 4090", 100.0),
            Node("gpu-c", "Tesla K20c", 500.0), Node("gpu-d", "Tesla M40", 300.0)]


def law_ms(node: Node) -> float:
    """The scripted RTT law without noise (the extender's guess before any model serves)."""
    return node.base_ms * (1.0 + node.util / 40.0)


# -- the history ---------------------------------------------------------------------------------
def history(n: int, nodes: list[Node], rate: float, end_ts: float, seed: int = 5) -> list[dict[str, Any]]:
    """``n`` training-samples of the pre-drift cluster ending at ``end_ts``, as the worker makes them."""
    rng = random.Random(seed)
    span_s = n / (rate * len(nodes))
    t0 = end_ts - span_s - 30.0
    windows = {nd.name: NodeWindow(30.0) for nd in nodes}
    out: list[dict[str, Any]] = []
    next_start = {nd.name: t0 + 30.0 + rng.expovariate(rate) for nd in nodes}  # 30 s of metrics first
    ts, shown = t0, 0
    while len(out) < n:
        for nd in nodes:
            snap = snapshot(nd, ts, rng)
            windows[nd.name].update(ts, snap["metrics"])
        for nd in nodes:
            while next_start[nd.name] < ts + 1.0 and len(out) < n:
                start = next_start[nd.name]
                next_start[nd.name] += rng.expovariate(rate)
                c = task(f"h-{len(out)}", APP, nd, start, rng)
                feats = windows[nd.name].aggregate(until_ts=start, window_s=30.0).features()
                out.append({"model_key": KEY, "task_id": c["task_id"], "app": APP, "node": nd.name,
                            "node_class": "gpu", "gpu_model": nd.gpu_model, "started_ts": start,
                            "rtt_ms": c["rtt_ms"], "input_size_mb": 64.0, "window_s": 30.0, "features": feats})
        ts += 1.0
        if len(out) - shown >= 10_000:
            shown = len(out)
            print(f"  history: {len(out):,}/{n:,} samples", flush=True)
    return out


# -- the live cluster ----------------------------------------------------------------------------
@dataclasses.dataclass
class Live:
    """The scripted cluster and the extender's part: metrics, predictions at start, completions at end."""

    s: Settings
    nodes: list[Node]
    rate: float
    weights: dict[str, dict[str, float]]
    rng: random.Random = dataclasses.field(default_factory=lambda: random.Random(9))
    pending: list[tuple[float, int, dict[str, Any]]] = dataclasses.field(default_factory=list)
    next_start: dict[str, float] = dataclasses.field(default_factory=dict)
    last_snap: float = 0.0
    count: int = 0

    async def step(self, out: Sender, version: int) -> None:
        now = time.time()
        if now - self.last_snap >= 1.0:
            self.last_snap = now
            for nd in self.nodes:
                await out.send("node-metrics", snapshot(nd, now, self.rng))
        for nd in self.nodes:
            nxt = self.next_start.setdefault(nd.name, now + self.rng.expovariate(self.rate))
            while nxt <= now:
                self.count += 1
                c = task(f"live-{self.count}", APP, nd, nxt, self.rng)
                guess = self.weights.get(nd.name, {}).get(APP) or law_ms(nd)
                await out.send("rtt-predictions", prediction(c["task_id"], APP, nd.name, nxt, guess, version or None))
                heapq.heappush(self.pending, (c["finished_ts"], self.count, c))
                nxt += self.rng.expovariate(self.rate)
            self.next_start[nd.name] = nxt
        while self.pending and self.pending[0][0] <= now:
            await out.send("task-completions", heapq.heappop(self.pending)[2])
        await out.flush()


def worker_version(url: str) -> float:
    text = urllib.request.urlopen(url, timeout=5).read().decode()  # noqa: S310 (a local http URL)
    return metric_value(text, f'rtt_worker_model_version{{model_key="{KEY}"}}')


@dataclasses.dataclass
class Trial:
    node: str
    t0: float
    marks: dict[str, float]
    detail: dict[str, Any]


async def run_trials(s: Settings, url: str, args: argparse.Namespace) -> tuple[dict[str, Any], list[Trial]]:
    nodes = cluster()
    end = time.time()
    print(f"building a history of {args.samples:,} samples ...", flush=True)
    samples = history(args.samples, nodes, args.rate, end)
    await produce(s, [("training-samples", v) for v in samples])
    weights: dict[str, dict[str, float]] = {}
    live = Live(s, nodes, args.rate, weights)
    setup: dict[str, Any] = {"debounce_s": s.retrain_debounce_s}
    trials: list[Trial] = []
    trainer = TrainerService(s, catch_up_timeout_s=60.0)
    async with (trainer, Sender(s) as out, Reader(s, "prediction-errors") as errors,
                Reader(s, "retrain-events") as events, Reader(s, "model-updates") as updates,
                Reader(s, "node-weights", lambda v: weights.__setitem__(v["node"], v["predicted_rtt_ms"]))):
        def version() -> int:
            return max((u["version"] for u in updates.values if u["model_key"] == KEY), default=0)

        while trainer.history.count(KEY) < args.samples:
            await asyncio.sleep(0.2)
        print(f"trainer holds {trainer.history.count(KEY):,} samples; cold start -> v1 ...", flush=True)
        sent = time.time()
        await out.send("retrain-events", {
            "model_key": KEY, "reason": "cold_start", "cumulative_error": float(args.samples), "threshold": 200.0,
            "ts": sent, "onset_ts": None})
        await updates.wait(lambda v: version() >= 1, 300.0, "v1")
        setup["v1_s"] = time.time() - sent
        setup["v1"] = next(u for u in updates.values if u["model_key"] == KEY)["metrics"]
        while worker_version(url) < 1:
            await asyncio.sleep(0.5)
        order = [nodes[0], nodes[2], nodes[1], nodes[3]]
        phase = random.Random(args.seed)
        for k in range(args.trials):
            drifted = order[k % len(order)]
            print(f"trial {k + 1}/{args.trials}: warm-up of {args.warm_up} periods with pairs on {drifted.name} "
                  f"since the last promotion, {s.retrain_debounce_s:g} s since the last retrain-event ...", flush=True)
            start = time.time()
            while True:  # the node's detector has its reference, and no retrain is running
                await live.step(out, version())
                since = max([start] + [u["ts"] + 2.0 for u in updates.values if u["model_key"] == KEY])
                last_event = max([0.0] + [e["ts"] for e in events.values if e["model_key"] == KEY])
                periods = [e for e in errors.values if e["node"] == drifted.name and e["ts"] > since
                           and APP in e["apps"] and drifted.name in weights]
                quiet = time.time() - last_event > s.retrain_debounce_s  # the key's debounce is over
                if len(periods) >= args.warm_up and quiet and not trainer._training:
                    break
                await asyncio.sleep(0.05)
            pre = statistics.median(e["apps"][APP]["mape"] for e in periods[-args.warm_up:])
            phase_end = time.time() + phase.uniform(0.0, s.error_period_s)  # t0 anywhere in a period
            while time.time() < phase_end:
                await live.step(out, version())
                await asyncio.sleep(0.05)
            t0, v_before = time.time(), version()
            drifted.util = DRIFT_UTIL
            live.last_snap = 0.0  # the new utilisation is visible in the next snapshot, now
            print(f"  t0: {drifted.name} RTT doubles (pre-drift period MAPE median {pre:.3f})", flush=True)
            marks: dict[str, float] = {}
            detail: dict[str, Any] = {"pre_mape": pre, "outcomes_before": len(trainer.outcomes)}
            deadline = t0 + args.timeout
            while time.time() < deadline:
                await live.step(out, version())
                if "shown" not in marks:
                    shown = [e for e in errors.values if e["node"] == drifted.name and e["ts"] > t0
                             and APP in e["apps"] and e["apps"][APP]["mape"] > pre + 0.1]
                    if shown:
                        marks["shown"], detail["shown_mape"] = shown[0]["ts"], shown[0]["apps"][APP]["mape"]
                if "event" not in marks:
                    ev = [e for e in events.values if e["model_key"] == KEY and e["reason"] == "drift"
                          and e["ts"] > t0]
                    if ev:
                        marks["event"], detail["event"] = ev[0]["ts"], ev[0]
                if "promoted" not in marks and version() > v_before:
                    u = next(u for u in updates.values if u["model_key"] == KEY and u["version"] > v_before)
                    marks["promoted"], detail["update"] = u["ts"], u
                if "promoted" in marks and "served" not in marks and worker_version(url) > v_before:
                    marks["served"] = time.time()
                if "served" in marks:
                    after = [e["apps"][APP]["mape"] for e in errors.values if e["node"] == drifted.name
                             and e["ts"] > marks["served"] + s.error_period_s and APP in e["apps"]]
                    if after:
                        marks["recovered" if after[0] < RECOVERED_MAPE else "not_recovered"] = time.time()
                        detail["after_mape"] = after[0]
                        break
                await asyncio.sleep(0.05)
            detail["outcomes"] = list(trainer.outcomes)[detail.pop("outcomes_before"):]
            trials.append(Trial(drifted.name, t0, marks, detail))
            drifted.util = 20.0  # back to normal: a change too, which the next warm-up lets settle
            print(f"  marks (s after t0): { {k: round(v - t0, 1) for k, v in marks.items()} }", flush=True)
        setup["train_seconds"] = trainer.metrics.registry.get_sample_value("rtt_trainer_training_seconds_sum")
        setup["train_count"] = trainer.metrics.registry.get_sample_value("rtt_trainer_training_seconds_count")
    return setup, trials


def _fmt(marks: dict[str, float], a: str, b: str) -> str:
    return f"{marks[b] - marks[a]:6.1f} s" if a in marks and b in marks else "     -  "


def _outcome(o: Any) -> str:
    if o.verdict is None:
        return f"{o.reason}: {o.outcome} {o.detail}"
    champion = o.verdict.champion_rmse_ms
    return (f"{o.reason}: {o.outcome} (challenger {o.verdict.challenger_rmse_ms:.1f} ms vs champion "
            f"{'none' if champion is None else f'{champion:.1f} ms'})")


def report(setup: dict[str, Any], trials: list[Trial], args: argparse.Namespace, period_s: float) -> str:
    v1 = setup["v1"]
    lines = [f"history {args.samples:,} samples, {args.rate:g} tasks/s on each of 4 nodes, error period "
             f"{period_s:g} s, warm-up {args.warm_up} periods, retrain debounce {setup['debounce_s']:g} s, "
             f"load average {os.getloadavg()[0]:.1f}",
             f"v1 (cold start, warm trainer, no champion): event -> model-updates {setup['v1_s']:.1f} s; "
             f"holdout rmse {v1['rmse_ms']:.1f} ms, mape {v1['mape']:.4f}",
             f"training (build + select + fit + score), all retrains: {setup['train_count']:.0f} in "
             f"{setup['train_seconds']:.1f} s", ""]
    head = (f"{'trial':<6}{'node':<7}{'-> errors':>10}{'-> event':>10}{'-> promoted':>12}{'-> served':>10}"
            f"{'-> recovered':>13}  {'event -> promoted':>17}  detection  goal")
    lines += [head, "-" * len(head)]
    totals = []
    for k, t in enumerate(trials, 1):
        m = {"t0": t.t0, **t.marks}
        periods = math.ceil((m["event"] - t.t0) / period_s) if "event" in m else None
        ok = "promoted" in m and m["promoted"] - t.t0 <= GOAL_S
        if "promoted" in m:
            totals.append(m["promoted"] - t.t0)
        rec = "recovered" if "recovered" in m else "not_recovered"
        lines.append(f"{k:<6}{t.node:<7}{_fmt(m, 't0', 'shown'):>10}{_fmt(m, 't0', 'event'):>10}"
                     f"{_fmt(m, 't0', 'promoted'):>12}{_fmt(m, 't0', 'served'):>10}{_fmt(m, 't0', rec):>13}  "
                     f"{_fmt(m, 'event', 'promoted'):>17}  {periods if periods is not None else '-'} periods  "
                     f"{'<= 30 s: met' if ok else 'missed'}")
    lines.append("")
    for k, t in enumerate(trials, 1):
        d = t.detail
        ev = d.get("event") or {}
        outs = "; ".join(_outcome(o) for o in d["outcomes"]) or "nothing"
        lines.append(f"trial {k}: pre-drift MAPE {d['pre_mape']:.3f}, first period showing it "
                     f"{d.get('shown_mape', 0):.3f}, event cumulative {ev.get('cumulative_error', 0):.3f} > "
                     f"{ev.get('threshold', 0):.3f}, MAPE after {d.get('after_mape', math.nan):.3f}; trainer: {outs}")
    if totals:
        lines.append(f"\ndrift onset -> promoted model: median {statistics.median(totals):.1f} s over {len(totals)} "
                     f"trial(s) (goal <= {GOAL_S:.0f} s)")
    return "\n".join(lines)


CONTENDER = """
import time, numpy as np, xgboost
X = np.random.default_rng(0).random((40000, 8), dtype=np.float32)
d = xgboost.DMatrix(X, label=X[:, 0] * 100)
end = time.time() + 600
while time.time() < end:
    xgboost.train({"max_depth": 8, "max_bin": 512}, d, 20)
"""


def retrain_only(args: argparse.Namespace) -> str:
    h = SampleHistory(args.samples)
    for v in history(args.samples, cluster(), args.rate, time.time()):
        h.add(v)
    ds = h.dataset(KEY)
    train_challenger(ds.rows(len(ds) - 2_000), "gpu")  # loads the numba caches once
    threads = {"every CPU (XGBoost's default)": os.cpu_count() or 1, "default_nthread()": default_nthread()}
    lines = [f"train_challenger on {len(ds):,} rows (selection + XGBoost gpu preset + holdout scoring)",
             f"{'machine':<28}{'threads':<34}{'seconds':>8}{'ratio':>7}{'rmse ms':>9}{'mape':>8}"]
    for contended in (False, True):
        rival = subprocess.Popen([sys.executable, "-c", CONTENDER]) if contended else None  # noqa: S603
        time.sleep(2.0 if contended else 0.0)
        try:
            base = None
            for label, n in threads.items():
                t = time.perf_counter()
                ch = train_challenger(ds, "gpu", params={"nthread": n})
                sec = time.perf_counter() - t
                base = base or sec
                lines.append(f"{'beside an XGBoost process' if contended else 'idle':<28}{f'{label}: {n}':<34}"
                             f"{sec:>8.2f}{sec / base:>7.2f}{ch.metrics['rmse_ms']:>9.2f}{ch.metrics['mape']:>8.4f}")
                print(f"  {'contended' if contended else 'idle'}, {n} thread(s): {sec:.2f} s", flush=True)
        finally:
            if rival is not None:
                rival.terminate()
                rival.wait()
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="5,000 samples instead of 50,000")
    ap.add_argument("--samples", type=int, default=None, help="training samples in the key's history")
    ap.add_argument("--rate", type=float, default=5.0, help="tasks per second per node (default 5)")
    ap.add_argument("--trials", type=int, default=1, help="drifts, one after the other on different nodes")
    ap.add_argument("--warm-up", type=int, default=14, help="periods with pairs before the drift (default 14)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds after t0 to wait for a recovery")
    ap.add_argument("--retrain-only", action="store_true", help="time one retrain of the history, no broker")
    ap.add_argument("--debounce", type=float, default=None,
                    help=f"the worker's RTT_RETRAIN_DEBOUNCE_S (default: {Settings.from_env({}).retrain_debounce_s:g})")
    ap.add_argument("--seed", type=int, default=1, help="seeds where in an error period each drift begins")
    args = ap.parse_args()
    args.samples = args.samples or (5_000 if args.quick else 50_000)
    if args.retrain_only:
        print(retrain_only(args))
        return 0
    broker = EmbeddedBroker().start()
    tmp = Path(tempfile.mkdtemp(prefix="bench-promotion-"))
    try:
        s = Settings.from_env({}, kafka_bootstrap=broker.bootstrap, topic_prefix="bpr-", models_dir=str(tmp / "m"))
        if args.debounce is not None:
            s = dataclasses.replace(s, retrain_debounce_s=args.debounce)
        asyncio.run(ensure_topics(s))
        with ProcessGroup(tmp / "logs") as group:
            print("starting the worker ...", flush=True)
            url = start_worker(group, s)
            setup, trials = asyncio.run(run_trials(s, url, args))
        print()
        print(report(setup, trials, args, s.error_period_s))
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
