"""Extender speed: prioritize in process beside two XGBoost baselines, and over HTTP as it runs in production.

    python3 bench/bench_extender.py               # full run (a few minutes)
    python3 bench/bench_extender.py --quick       # about a minute
    python3 bench/bench_extender.py --http-only   # (or --in-process-only, --startup-only)
    python3 bench/bench_extender.py --uvloop      # the HTTP server on uvloop instead of asyncio's loop
    python3 bench/bench_extender.py --quick --http-only --seconds 15   # longer 64-node phases
    python3 bench/bench_extender.py --http-only --profile ext.prof   # + the 64-node server's cProfile

In process (16 / 64 / 512 / 5,000 nodes, NodeList and NodeNames payloads): decode + decide + encode, beside
the baselines of ``extender_setup`` — the same features through one batched ``Booster.inplace_predict``, and
through one ``inplace_predict`` per node — with the same number of repetitions each, and a check that all
give the same scores.

Over HTTP (``extender_http``): 64 nodes at 200 requests/s (open loop) and flat out (closed loop, 4
connections), and 5,000 nodes in bursts of 20 concurrent requests, both payloads; the server learns the
view and the model from the embedded broker, every node's features are republished once a second and
rtt-predictions are published to Kafka throughout. The server runs pinned to core 0, the load generator and
the broker to core 1. Latencies move with whatever else runs on the machine; the server's CPU per request
hardly does — read them with the load average printed under the tables.

Start-up: ``rttsched extender`` with no broker at all and no Redis, from its start to its first ``/healthz``
200 (it serves before Kafka exists), beside ``rttsched extender --help`` from its start to its exit (the
interpreter and the CLI's imports: the floor of any ``rttsched`` process).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from extender_setup import baseline, baseline_rows, in_process_service, log, ours, payload, pct, train, view

from app.config import Settings
from app.extender.server import GC_GEN0_THRESHOLD
from app.kafka.embedded import EmbeddedBroker, free_port

HERE = Path(__file__).resolve()
BURST = 20  # concurrent 5,000-node requests
NOW = 1_715_678_500.0


def in_process_table(quick: bool) -> dict[str, float]:
    """Prints the in-process table; returns the worst 5,000-node p99 (ms)."""
    booster = train()
    reps = {16: 100, 64: 100, 512: 20, 5000: 5} if quick else {16: 1000, 64: 1000, 512: 200, 5000: 20}
    gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])  # as the server (tune_gc)
    rows, worst = [], 0.0
    for n, iters in reps.items():
        features = view(n, NOW - 1)
        service, rows_of = in_process_service(booster, features, NOW), baseline_rows(features)
        gc.freeze()
        for k, mode in enumerate(("nodes", "names")):
            log(f"in process, {n} nodes, {mode}: {iters} x ours, batched and per-node baselines")
            body = payload(n, mode)
            ours(service, body, 3, first=10**6 + 10 * k)  # warm-up, with pods of its own
            # each payload its own pods: the same pods again would find every row in the predictor's memory
            mine, scores = ours(service, body, iters, first=k * 10**5)
            batched, b_scores = baseline(booster, rows_of, body, iters, per_node=False)
            single, s_scores = baseline(booster, rows_of, body, iters, per_node=True)
            same = agreement(scores, b_scores, s_scores)
            rows.append((n, mode, mine, batched, single, same))
            if n == 5000:
                worst = max(worst, pct(mine, 99))
    print("\nprioritize in process: decode + decide + encode; baselines: orjson + a row per node + XGBoost")
    print(f"{'nodes':>5} {'payload':<9} {'ours p50':>9} {'ours p99':>9} {'batch p50':>9} {'batch p99':>9} "
          f"{'node p50':>9} {'node p99':>9} {'x batch':>8} {'x node':>8}  same scores")
    for n, mode, mine, batched, single, same in rows:
        print(f"{n:>5} {'NodeList' if mode == 'nodes' else 'NodeNames':<9} {pct(mine, 50):>9.3f} {pct(mine, 99):>9.3f} "
              f"{pct(batched, 50):>9.3f} {pct(batched, 99):>9.3f} {pct(single, 50):>9.3f} {pct(single, 99):>9.3f} "
              f"{pct(batched, 50) / pct(mine, 50):>7.1f}x {pct(single, 50) / pct(mine, 50):>7.1f}x  {same}")
    print(f"(ms; repetitions per size {', '.join(f'{n}: {r}' for n, r in reps.items())}, the same for all three; "
          "x = baseline p50 / ours p50;\n same scores: ±1 on 1 of n = the pick made the only top score where another "
          "candidate tied with it)")
    return {"p99_5000_ms": worst}


def startup_table(runs: int) -> dict[str, float]:
    """Prints the start-up table; returns the slowest start to /healthz (s)."""
    import statistics
    import urllib.request

    up, floor = [], []
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(HERE.parents[1]), "RTT_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}",
               "REDIS_URL": "", "RTT_MODELS_DIR": str(Path(tmp) / "models")}
        cli = [sys.executable, "-m", "app.cli.main", "extender"]
        for k in range(runs):
            log(f"start-up {k + 1}/{runs}: rttsched extender --help, then rttsched extender without a broker")
            t0 = time.monotonic()
            subprocess.run([*cli, "--help"], env=env, cwd=tmp, check=True, stdout=subprocess.DEVNULL, timeout=60)
            floor.append(time.monotonic() - t0)
            port = free_port()
            t0 = time.monotonic()
            proc = subprocess.Popen([*cli, "--host", "127.0.0.1", "--port", str(port), "--no-redis"], env=env, cwd=tmp,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                while True:
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:  # noqa: S310
                            if r.status == 200:
                                break
                    except OSError:
                        pass
                    if proc.poll() is not None or time.monotonic() - t0 > 60:
                        raise RuntimeError("the extender did not answer /healthz within 60 s")
                    time.sleep(0.01)
                up.append(time.monotonic() - t0)
            finally:
                proc.terminate()
                proc.wait(10)
    med_up, med_floor = statistics.median(up), statistics.median(floor)
    print("\nstart-up without a broker or Redis: from the process's start")
    print(f"{'runs':>4} {'/healthz p50':>12} {'/healthz max':>12} {'--help p50':>10} {'--help max':>10} "
          f"{'x --help':>8}")
    print(f"{runs:>4} {med_up:>12.2f} {max(up):>12.2f} {med_floor:>10.2f} {max(floor):>10.2f} "
          f"{med_up / med_floor:>7.1f}x")
    print("(s; /healthz = first 200 of `rttsched extender`; --help = `rttsched extender --help` to its exit: the "
          "interpreter and the CLI's imports;\n x --help = /healthz p50 / --help p50)")
    return {"startup_max_s": max(up)}


def agreement(ours_: list[int], *others: list[int]) -> str:
    """``yes`` when every baseline gives our scores; else how many differ and by how much at most.

    The decision makes the node it picks the only top score: when another candidate ties with it (more
    likely the more candidates there are), the pick gets one point more than the baselines give it.
    """
    diffs = [abs(a - b) for other in others for a, b in zip(ours_, other, strict=True)]
    if not any(diffs):
        return "yes"
    worst = max(diffs)
    off = sum(1 for d in diffs if d) // len(others) or 1
    return f"{'±1' if worst == 1 else f'NO, up to {worst}'} on {off} of {len(ours_)}"


def http_run(n: int, phases: list[dict[str, Any]], idle_s: float, use_uvloop: bool,
             profile: str | None = None, null: bool = False) -> dict[str, Any]:
    """The client's phases against the production server over a view of ``n`` nodes (``null``: against a
    server that answers at once, the load generator's floor), with the broker and the feeder running."""
    from extender_http import CLIENT_CORE, pin, prepare

    broker = EmbeddedBroker().start()
    pin(CLIENT_CORE, broker.pid or 0)
    server = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            st = {"kafka_bootstrap": broker.bootstrap, "topic_prefix": f"bench{uuid.uuid4().hex[:8]}-",
                  "models_dir": tmp}
            log(f"HTTP {n} nodes: topics, model and view on the embedded broker")
            prepare(Settings.from_env({}, **st), n)
            port = free_port()
            cfg = {"settings": st, "port": port, "nodes": n, "phases": phases, "idle_s": idle_s, "uvloop": use_uvloop,
                   "profile": profile, "null": null}
            server = subprocess.Popen([sys.executable, str(HERE), "--serve", json.dumps(cfg)])
            t0 = time.monotonic()
            wait_ready(port)
            log(f"HTTP {n} nodes: {'null ' if null else ''}server ready after {time.monotonic() - t0:.1f} s; "
                "load generator on core 1")
            out = subprocess.run([sys.executable, str(HERE), "--client", json.dumps(cfg)], check=True,
                                 stdout=subprocess.PIPE, timeout=1800).stdout
            return dict(orjson.loads(out))
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        broker.stop()


def wait_ready(port: int, timeout_s: float = 180.0) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:  # noqa: S310
                if json.loads(r.read())["models"] >= 1:
                    return
        except (OSError, urllib.error.HTTPError, KeyError):
            pass
        time.sleep(0.2)
    raise RuntimeError("the bench server did not become ready")


def idle_line(idle: dict[str, Any]) -> str:
    gc_max = max(idle["gc_s"], default=0.0) * 1000
    return (f"idle (feed only, no requests): background CPU {1000 * idle['cpu_per_s']:.1f} ms/s, loop lag p99 "
            f"{pct(idle['lag_s'], 99):.3f} ms, longest loop step {pct(idle['step_s'], 100):.3f} ms (p99.9 "
            f"{pct(idle['step_s'], 99.9):.3f}), {len(idle['gc_s'])} full collections (longest {gc_max:.1f} ms), "
            f"{len(idle['young_s'])} young (longest {max(idle['young_s'], default=0.0) * 1000:.1f} ms)")


def cpu_ms(r: dict[str, Any]) -> float:
    return 1000.0 * r["cpu_s"] / max(r["requests"], 1)


def http_tables(quick: bool, use_uvloop: bool, profile: str | None = None,
                seconds: float | None = None) -> dict[str, float]:
    seconds = seconds or (3.0 if quick else 10.0)
    small = http_run(64, [{"name": "rate", "rate": 200.0, "seconds": seconds, "warmup": 50},
                          {"name": "max", "conc": 4, "seconds": seconds, "warmup": 50}], 3.0, use_uvloop, profile)
    bursts = [{"name": "burst", "conc": BURST, "bursts": 3 if quick else 10, "warmup": 3}]
    big = http_run(5000, bursts, 3.0, use_uvloop)
    floor = http_run(5000, bursts, 1.0, use_uvloop, null=True)
    print(f"\nHTTP /prioritize, 64 nodes ({'uvloop' if use_uvloop else 'asyncio'} loop): server on core 0; "
          "load generator, broker and 64 node-features/s on core 1")
    print(f"{'payload':<10} {'load':<12} {'req/s':>6} {'client p50':>10} {'client p99':>10} {'client max':>10} "
          f"{'server p50':>10} {'server p99':>10} {'lag p99':>8} {'req step':>8} {'bg step':>8} {'CPU/req':>8} "
          f"{'req/s/core':>10}")
    goals: dict[str, float] = {}
    for mode in ("nodes", "names"):
        for phase, label in (("rate", "200 req/s"), ("max", "max, 4 conn")):
            r = small[f"{mode}/{phase}"]
            name = "NodeList" if mode == "nodes" else "NodeNames"
            client_s, handler_s, lag_s = r["client_s"], r["handler_s"], r["lag_s"]
            steps, bg = r["step_s"], r["background_s"]
            print(f"{name:<10} {label:<12} {r['achieved']:>6.0f} {pct(client_s, 50):>10.3f} {pct(client_s, 99):>10.3f} "
                  f"{pct(client_s, 100):>10.3f} {pct(handler_s, 50):>10.3f} {pct(handler_s, 99):>10.3f} "
                  f"{pct(lag_s, 99):>8.3f} "
                  f"{pct(steps, 100):>8.3f} {pct(bg, 100):>8.3f} {cpu_ms(r):>8.3f} {1000 / cpu_ms(r):>10.0f}")
            goals[f"{mode}/{phase}/p99"] = pct(r["client_s"], 99)
            goals[f"{mode}/{phase}/cpu"] = cpu_ms(r)
            goals[f"{mode}/{phase}/bg"] = pct(r["background_s"], 100)
    print(idle_line(small["idle"]))
    print(f"\nHTTP /prioritize, 5,000 nodes: bursts of 20 concurrent requests; 5,000 node-features/s "
          f"(RTT_EXTENDER_MAX_BODY_BYTES {64} MiB for the 14 MB NodeList)")
    print(f"{'payload':<10} {'requests':>8} {'client p50':>10} {'client p99':>10} {'client max':>10} "
          f"{'1st burst':>10} {'server p99':>10} {'lag p99':>8} {'req step':>8} {'bg step':>8} {'CPU/req':>8}")
    def client_columns(mode: str, r: dict[str, Any]) -> str:
        lat = r["client_s"]
        return (f"{'NodeList' if mode == 'nodes' else 'NodeNames':<10} {len(lat):>8} "
                f"{pct(lat, 50):>10.1f} {pct(lat, 99):>10.1f} {pct(lat, 100):>10.1f} {pct(lat[:BURST], 100):>10.1f}")

    for mode in ("nodes", "names"):
        r = big[f"{mode}/burst"]
        print(f"{client_columns(mode, r)} "
              f"{pct(r['handler_s'], 99):>10.1f} {pct(r['lag_s'], 99):>8.3f} {pct(r['step_s'], 100):>8.3f} "
              f"{pct(r['background_s'], 100):>8.3f} {cpu_ms(r):>8.2f}")
        goals[f"{mode}/big/max"] = pct(r["client_s"], 100)
        goals[f"{mode}/big/later"] = pct(r["client_s"][BURST:], 100)
    for mode in ("nodes", "names"):
        r = floor[f"{mode}/burst"]
        print(f"{client_columns(mode, r)}   <- the load generator's floor: the same bursts against a server that "
              f"answers at once ({cpu_ms(r):.2f} ms CPU/req)")
        goals[f"{mode}/big/floor"] = pct(r["client_s"], 100)
    print(idle_line(big["idle"]))
    goals["idle5000/step"] = pct(big["idle"]["step_s"], 100)
    print("(ms; client = POST to answer as the load generator sees it; 1st burst = the slowest of the first burst "
          "after start,\n whose memory is new to the process; server = inside the verb handler; lag = how "
          "late a 2 ms timer fires in the server;\n req step / bg step = the longest loop step, on the server "
          "thread's CPU clock, that read or answered requests (it holds\n the requests that arrived with it) / that "
          "did neither (feed, rebuilds, publishing, timers); other processes cannot inflate them;\n CPU/req = server "
          "process CPU per request, background work included; req/s/core = 1 / CPU per request)")
    return goals


def goals_line(inproc: dict[str, float], http: dict[str, float], startup: dict[str, float] | None = None) -> None:
    def mark(ok: bool) -> str:
        return "met" if ok else "NOT met"

    lines = []
    if http:
        p99 = max(http["nodes/rate/p99"], http["names/rate/p99"])
        lines.append(f"client p99 <= 5 ms at 200 req/s, 64 nodes, both payloads: {mark(p99 <= 5)} ({p99:.2f} ms worst)")
        per_core = 1000 / http["names/max/cpu"]
        lines.append(f">= 1,000 req/s per core, NodeNames, 64 nodes: {mark(per_core >= 1000)} ({per_core:.0f})")
        lines.append(f"CPU/request <= 0.5 ms NodeNames: {mark(http['names/max/cpu'] <= 0.5)} "
                     f"({http['names/max/cpu']:.3f}); <= 1.5 ms NodeList: {mark(http['nodes/max/cpu'] <= 1.5)} "
                     f"({http['nodes/max/cpu']:.3f}) (closed loop, 64 nodes)")
        step = max(http[k] for k in http if k.endswith("/bg"))
        lines.append(f"no background loop step over 2 ms while serving 64 nodes: {mark(step <= 2)} "
                     f"({step:.2f} ms longest)")
        lines.append(f"no background loop step over 2 ms at 5,000 nodes (idle): {mark(http['idle5000/step'] <= 2)} "
                     f"({http['idle5000/step']:.2f} ms longest)")
        big = max(http["nodes/big/max"], http["names/big/max"])
        later = max(http["nodes/big/later"], http["names/big/later"])
        floor = max(http["nodes/big/floor"], http["names/big/floor"])
        lines.append(f"5,000 nodes over HTTP < 1 s at 20 concurrent: {mark(big < 1000)} ({big:.0f} ms slowest, "
                     f"{later:.0f} ms after the first burst; the load generator against a server that answers at "
                     f"once: {floor:.0f} ms)")
    if inproc:
        lines.append(f"5,000 nodes in process p99 <= 100 ms: {mark(inproc['p99_5000_ms'] <= 100)} "
                     f"({inproc['p99_5000_ms']:.1f} ms worst payload)")
    if startup:
        lines.append(f"serves /healthz <= 3 s after its start, no broker: {mark(startup['startup_max_s'] <= 3)} "
                     f"({startup['startup_max_s']:.2f} s slowest)")
    print("\ngoals:\n  " + "\n  ".join(lines))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions and shorter phases")
    p.add_argument("--seconds", type=float, metavar="S", help="length of each 64-node HTTP phase (default 3 with "
                   "--quick, else 10); long flat-out phases show the collector's passes in the client max")
    p.add_argument("--http-only", action="store_true")
    p.add_argument("--in-process-only", action="store_true")
    p.add_argument("--startup-only", action="store_true", help="only the start-up table (no broker, no Redis)")
    p.add_argument("--startup-runs", type=int, metavar="N", help="starts timed (default 3 with --quick, else 10)")
    p.add_argument("--uvloop", action="store_true", help="run the HTTP server on uvloop")
    p.add_argument("--profile", metavar="FILE", help="write the 64-node HTTP server's cProfile to FILE (pstats)")
    p.add_argument("--idle-only", type=int, metavar="N", help="only the idle line of a 5,000-node HTTP server "
                   "(8 s of node-features, no requests), N runs")
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--client", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        from extender_http import serve

        serve(json.loads(a.serve))
        return 0
    if a.client:
        from extender_http import client

        sys.stdout.write(orjson.dumps(client(json.loads(a.client))).decode())
        return 0
    if a.uvloop:
        try:
            import uvloop  # noqa: F401
        except ImportError:
            p.error("--uvloop needs uvloop (pip install uvloop); the extender itself does not use it")
    load = os.getloadavg()
    if a.idle_only:
        for _ in range(a.idle_only):
            print(idle_line(http_run(5000, [], 8.0, a.uvloop)["idle"]), flush=True)
        print(f"load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after, on {os.cpu_count()} cores")
        return 0
    only = a.http_only or a.in_process_only or a.startup_only
    runs = a.startup_runs or (3 if a.quick else 10)
    startup = startup_table(runs) if a.startup_only or not only else {}
    inproc = in_process_table(a.quick) if a.in_process_only or not only else {}
    http = (http_tables(a.quick, a.uvloop, a.profile and str(Path(a.profile).resolve()), a.seconds)
            if a.http_only or not only else {})
    goals_line(inproc, http, startup)
    print(f"load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after, on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
