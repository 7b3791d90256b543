"""Bridge vs Prometheus on a live node_exporter: window means of node-metrics beside Prometheus' own rate() queries.

Starts Debian's prometheus-node-exporter and prometheus (2.42; both ``apt-get install``-able, run unprivileged
on free ports) and the bridge, all scraping the exporter every second, while the machine goes through phases:
baseline (whatever else the machine runs), CPU saturated (one busy process more than CPUs: CPU pressure near
1 s/s), disk writes. For each phase, the mean of the bridge's per-scrape values (what a worker's window mean
is; also time-weighted) is printed beside Prometheus' value over the same span -- queried at the bridge's
last scrape, over the range back to the scrape before its first --, with their ratio. Prometheus scrapes at
its own instants and extrapolates ``rate()`` to the range's edges, so a bursty counter (disk writes) can
differ by a few % on a 20 s window; smooth ones agree closely.

    python3 bench/bench_bridge_prometheus.py            # ~80 s: 3 phases of 20 s
    python3 bench/bench_bridge_prometheus.py --quick    # ~45 s
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from app.bridge.scraper import run_bridge
from app.bridge.targets import Endpoint, Target
from app.config import Settings
from app.kafka.embedded import free_port

WARM_UP_S = 8.0
EXCLUDED = 'device!~"(loop|ram|zram|sr|dm-|md).*"'
QUERIES = {  # canonical metric -> PromQL over a window [w]
    "cpu_usage_user": 'sum(rate(node_cpu_seconds_total{mode="user"}[w])) / sum(rate(node_cpu_seconds_total[w]))',
    "cpu_usage_system": 'sum(rate(node_cpu_seconds_total{mode="system"}[w])) / sum(rate(node_cpu_seconds_total[w]))',
    "cpu_idle": 'sum(rate(node_cpu_seconds_total{mode="idle"}[w])) / sum(rate(node_cpu_seconds_total[w]))',
    "cpu_iowait": 'sum(rate(node_cpu_seconds_total{mode="iowait"}[w])) / sum(rate(node_cpu_seconds_total[w]))',
    "cpu_pressure_waiting": "rate(node_pressure_cpu_waiting_seconds_total[w])",
    "io_pressure_waiting": "rate(node_pressure_io_waiting_seconds_total[w])",
    "context_switches_per_s": "rate(node_context_switches_total[w])",
    "disk_written_bytes_per_s": f"sum(rate(node_disk_written_bytes_total{{{EXCLUDED}}}[w]))",
    "disk_io_busy": f"max(rate(node_disk_io_time_seconds_total{{{EXCLUDED}}}[w]))",
    "load1": "avg_over_time(node_load1[w])",
    "memory_cache_usage": "avg_over_time(node_memory_Cached_bytes[w]) / avg_over_time(node_memory_MemTotal_bytes[w])",
}


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as f:
        return subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT)


def wait_http(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):  # noqa: S310 - loopback
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer in {timeout_s:.0f}s")


def burners(n: int, seconds: float, path: str = "") -> list[subprocess.Popen[bytes]]:
    code = ("import os,sys,time\nend=time.time()+float(sys.argv[1])\n"
            "f=open(sys.argv[2],'wb') if sys.argv[2] else None\nwhile time.time()<end:\n [i*i for i in range(20000)]\n"
            " if f: f.write(os.urandom(1<<16)); f.flush(); os.fsync(f.fileno())\n")
    return [subprocess.Popen([sys.executable, "-c", code, str(seconds), path if i == 0 else ""]) for i in range(n)]


def prom_query(base: str, query: str, at: float) -> float | None:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query, "time": f"{at:.3f}"})
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
        result = json.load(resp)["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="phases of 10 s instead of 20 s")
    args = ap.parse_args()
    phase_s = 10.0 if args.quick else 20.0
    exe_ne, exe_prom = shutil.which("prometheus-node-exporter"), shutil.which("prometheus")
    if not exe_ne or not exe_prom:
        print("needs prometheus-node-exporter and prometheus (apt-get install ...)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="bridge-vs-prom-"))
    ne_port, prom_port = free_port(), free_port()
    (tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
        f"scrape_configs: [{{job_name: node, static_configs: [{{targets: ['127.0.0.1:{ne_port}']}}]}}]\n")
    procs = [start([exe_ne, f"--web.listen-address=127.0.0.1:{ne_port}"], tmp / "node_exporter.log"),
             start([exe_prom, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}"], tmp / "prometheus.log")]
    rounds: list[dict] = []
    phases: list[tuple[str, float, float]] = []
    try:
        wait_http(f"http://127.0.0.1:{ne_port}/metrics")
        wait_http(f"http://127.0.0.1:{prom_port}/-/ready")
        settings = Settings.from_env({}, scrape_interval_s=1.0)
        target = Target("local", (Endpoint(f"http://127.0.0.1:{ne_port}/metrics", "node_exporter"),), "cpu")

        async def bridge() -> None:
            await run_bridge(settings, [target], scrapes=int(3 * phase_s + WARM_UP_S) + 3, publish=False,
                             on_round=lambda snaps: rounds.extend(s.message for s in snaps))

        async def phases_run() -> None:
            cpus = os.cpu_count() or 1
            await asyncio.sleep(WARM_UP_S)  # both scrapers running, start-up load gone
            for name, load in (("baseline", []), ("cpu saturated", burners(cpus + 1, phase_s)),
                               ("disk writes", burners(1, phase_s, str(tmp / "load.bin")))):
                t0 = time.time()
                print(f"phase: {name} ({phase_s:.0f} s)", flush=True)
                await asyncio.sleep(phase_s)
                phases.append((name, t0, time.time()))
                for p in load:
                    p.kill()
                    p.wait()

        async def both() -> None:
            await asyncio.gather(bridge(), phases_run())

        asyncio.run(both())
        time.sleep(2.0)  # Prometheus' last scrapes
        base = f"http://127.0.0.1:{prom_port}"
        print(f"\nwindow means of the bridge's node-metrics vs Prometheus over the same span (load: "
              f"{os.getloadavg()[0]:.2f})")
        print(f"{'phase':<14} {'metric':<26} {'bridge':>12} {'time-weighted':>13} {'prometheus':>12} "
              f"{'ratio':>7} {'tw ratio':>8}")
        for name, t0, t1 in phases:
            lo, hi = t0 + 2.0, t1  # skip the phase's first seconds: the load starting
            idx = [i for i, m in enumerate(rounds) if lo < m["ts"] <= hi and i > 0]
            # Prometheus over the span the bridge's values cover: from the scrape before the first to the last
            hi = rounds[idx[-1]]["ts"]
            window = f"{1000 * (hi - rounds[idx[0] - 1]['ts']):.0f}ms"
            for metric, q in QUERIES.items():
                pairs = [(rounds[i]["metrics"][metric], rounds[i]["ts"] - rounds[i - 1]["ts"]) for i in idx
                         if metric in rounds[i]["metrics"]]
                prom = prom_query(base, q.replace("[w]", f"[{window}]"), hi)
                if not pairs or prom is None:
                    continue
                mine = statistics.fmean(v for v, _ in pairs)
                weighted = sum(v * dt for v, dt in pairs) / sum(dt for _, dt in pairs)
                ratio, tw = (mine / prom, weighted / prom) if prom else (float("nan"), float("nan"))
                print(f"{name:<14} {metric:<26} {mine:>12.6g} {weighted:>13.6g} {prom:>12.6g} {ratio:>7.4f} "
                      f"{tw:>8.4f}")
        gaps = [b["ts"] - a["ts"] for a, b in zip(rounds, rounds[1:], strict=False)]
        print(f"\nintervals between bridge scrapes: mean {statistics.fmean(gaps):.3f} s, min {min(gaps):.3f}, "
              f"max {max(gaps):.3f}")
        clamped = [m for m in rounds if m["metrics"].get("cpu_pressure_waiting") == 1.0]
        print(f"\n{len(rounds)} bridge scrapes; cpu_pressure_waiting clamped to 1.0 in {len(clamped)}")
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
