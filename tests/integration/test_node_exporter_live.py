"""A real node_exporter (Debian's prometheus-node-exporter) on a free port -> bridge -> broker -> worker -> features.

The bridge scrapes the live exporter through a recording proxy, under CPU and disk load, every 2 s on the
real clock; the real worker (``rttsched worker``) turns node-metrics into node-features. Every expected value
is computed here from the pages the proxy recorded -- with an exposition reading of its own
(:func:`app.sim.scripted.samples`, a regular expression), never the bridge's code -- and the CPU shares, weighted
by each interval's CPU time, are compared with the ratio Prometheus' ``rate()`` gives over the same span.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from exporter_pages import cpu_share, read_until

from app.bridge.scraper import run_bridge
from app.bridge.targets import Endpoint, Target
from app.cli.processes import ProcessGroup
from app.config import Settings
from app.contracts import decode
from app.kafka.embedded import free_port
from app.sim.scripted import samples, start_worker

pytestmark = pytest.mark.integration

NODE = "live-node"
ROUNDS = 6
# a scrape slower than 0.8 of the interval goes out a round late beside the next (docs/bridge.md): under this load
# node_exporter can take most of a second, so 2 s keeps one page a round, which the test compares one to one
INTERVAL_S = 2.0
DISKS_EXCLUDED = re.compile(r"(loop|ram|zram|sr|dm-|md).*")
SHARES = {"cpu_usage_user": ("user",), "cpu_usage_system": ("system",), "cpu_idle": ("idle",),
          "cpu_iowait": ("iowait",), "cpu_usage_nice": ("nice",), "cpu_steal": ("steal",),
          "cpu_irq": ("irq", "softirq")}


@pytest.fixture
def node_exporter(tmp_path: Path) -> Iterator[str]:
    """Debian's prometheus-node-exporter on a free loopback port; its /metrics URL."""
    exe = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if exe is None:
        raise RuntimeError("prometheus-node-exporter not found: apt-get install prometheus-node-exporter")
    port = free_port()
    log = open(tmp_path / "node_exporter.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([exe, f"--web.listen-address=127.0.0.1:{port}",
                             f"--collector.textfile.directory={tmp_path}"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 15
        while True:
            with contextlib.suppress(OSError):
                import urllib.request

                with urllib.request.urlopen(url, timeout=1) as resp:  # noqa: S310 - loopback
                    if resp.status == 200:
                        break
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "node_exporter.log").read_text()
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


@contextlib.asynccontextmanager
async def recording_proxy(upstream: str, pages: list[str]) -> AsyncIterator[str]:
    """A loopback HTTP proxy to ``upstream`` that keeps every body it passes on, in order."""
    session = aiohttp.ClientSession()

    async def handle(request: web.Request) -> web.Response:
        async with session.get(upstream, headers={"Accept": request.headers.get("Accept", "*/*")}) as resp:
            body = await resp.text()
        pages.append(body)
        return web.Response(text=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
    finally:
        await runner.cleanup()
        await session.close()


def load(tmp_path: Path, seconds: float) -> list[subprocess.Popen[bytes]]:
    """For ``seconds``: twice as many CPU-bound processes as CPUs, plus one (CPU pressure saturates), and one
    writing and fsyncing a file (it waits on the disk much of the time)."""
    code = ("import os,sys,time\nend=time.time()+float(sys.argv[1])\n"
            "f=open(sys.argv[2],'wb') if sys.argv[2] else None\n"
            "while time.time()<end:\n"
            " [i*i for i in range(20000)]\n"
            " if f: f.write(os.urandom(1<<16)); f.flush(); os.fsync(f.fileno())\n")
    files = [str(tmp_path / "load.bin")] + [""] * (2 * (os.cpu_count() or 1) + 1)
    return [subprocess.Popen([sys.executable, "-c", code, str(seconds), f]) for f in files]


def rate(before: str, after: str, name: str, per_device: bool = False) -> Any:
    dt = samples(after, "node_time_seconds")[0] - samples(before, "node_time_seconds")[0]
    if not per_device:
        return (sum(samples(after, name)) - sum(samples(before, name))) / dt
    out = {}
    for line in after.splitlines():
        m = re.match(rf'^{name}{{device="([^"]+)"}} (\S+)$', line)
        if m and not DISKS_EXCLUDED.fullmatch(m.group(1)):
            out[m.group(1)] = (float(m.group(2)) - samples(before, name, device=m.group(1))[0]) / dt
    return out


def clamp01(v: float) -> float | None:
    return None if v < -0.05 or v > 1.05 else min(max(v, 0.0), 1.0)


def gauges(page: str) -> dict[str, float | None]:
    """The canonical gauges of one page (every scrape has them, the first one too)."""
    return {
        "cpu_count": float(len(set(re.findall(r'node_cpu_seconds_total{cpu="(\d+)"', page)))),
        "load1": samples(page, "node_load1")[0],
        "memory_cache_usage": samples(page, "node_memory_Cached_bytes")[0] / samples(
            page, "node_memory_MemTotal_bytes")[0],
    }


def share_rounding(before: str, after: str) -> float:
    """How far two sums of the interval's CPU counters, added in different orders, may differ in a share:
    a few ulps of every counter, over the interval's CPU time."""
    name = "node_cpu_seconds_total"
    total = sum(samples(after, name)) - sum(samples(before, name))
    return 8 * sys.float_info.epsilon * sum(samples(after, name)) / total


def expected(before: str, after: str) -> dict[str, float | None]:
    """The canonical values of one interval, from the two recorded pages alone."""
    out: dict[str, float | None] = {n: sum(cpu_share(before, after, m) for m in modes) for n, modes in SHARES.items()}
    out.update(gauges(after))
    out["context_switches_per_s"] = rate(before, after, "node_context_switches_total")
    out["cpu_pressure_waiting"] = clamp01(rate(before, after, "node_pressure_cpu_waiting_seconds_total"))
    out["disk_written_bytes_per_s"] = sum(rate(before, after, "node_disk_written_bytes_total", True).values())
    busy = [clamp01(v) for v in rate(before, after, "node_disk_io_time_seconds_total", True).values()]
    out["disk_io_busy"] = max((b for b in busy if b is not None), default=None)
    return out


def test_live_node_exporter_to_node_features(kafka_settings: Settings, node_exporter: str, tmp_path: Path) -> None:
    s = Settings.from_env({}, kafka_bootstrap=kafka_settings.kafka_bootstrap,
                          topic_prefix=kafka_settings.topic_prefix, scrape_interval_s=INTERVAL_S)
    pages: list[str] = []
    with ProcessGroup(tmp_path / "logs") as group:
        start_worker(group, s, RTT_FEATURE_WINDOW_S="60", RTT_FEATURE_EMIT_INTERVAL_S="0.2")
        burners = load(tmp_path, ROUNDS * INTERVAL_S + 2.0)
        try:
            async def bridge() -> None:
                async with recording_proxy(node_exporter, pages) as url:
                    target = Target(NODE, (Endpoint(url, "node_exporter"),), node_class="cpu")
                    stats = await run_bridge(s, [target], scrapes=ROUNDS)
                    assert (stats.messages, stats.failed_scrapes) == (ROUNDS, 0)

            asyncio.run(bridge())
        finally:
            for b in burners:
                b.kill()
                b.wait()

        def final(records: list[Any]) -> bool:
            return any(orjson.loads(r.value)["count"] == ROUNDS for r in records if r.key == NODE.encode())

        features = asyncio.run(read_until(s, "node-features", final, timeout_s=60))
        metrics = asyncio.run(read_until(s, "node-metrics", lambda r: len(r) >= ROUNDS))

    assert len(pages) == ROUNDS
    sent = [decode("node-metrics", r.value, strict=True) for r in sorted(metrics, key=lambda r: r.offset)]
    want = [expected(pages[i - 1], pages[i]) for i in range(1, ROUNDS)]
    for i, (got, exp) in enumerate(zip(sent[1:], want, strict=True), start=1):
        for name, value in exp.items():
            if value is None:
                assert name not in got["metrics"], name
            else:
                # a CPU share is a difference of large counters summed in some order: exact but for rounding
                tol = share_rounding(pages[i - 1], pages[i]) if name in SHARES else 1e-12
                assert got["metrics"][name] == pytest.approx(value, rel=1e-9, abs=tol), name
    assert sum(got["metrics"][n] for n in SHARES) == pytest.approx(1.0, abs=1e-9)
    # saturated: CPU pressure near 1 s/s, readings a little over 1 clamped to 1.0 rather than dropped
    assert max(w["cpu_pressure_waiting"] or 0.0 for w in want) > 0.8

    last = [decode("node-features", r.value, strict=True) for r in sorted(features, key=lambda r: r.offset)
            if r.key == NODE.encode()][-1]
    assert last["count"] == ROUNDS and last["node_class"] == "cpu" and last["stale"] == []
    f = last["features"]
    # the worker aggregates what the bridge sent (checked against the exporter's pages above, CPU shares to
    # their rounding): its window is compared with those values, not with the recomputed ones
    series = {name: [got["metrics"][name] for got in sent[1:]]
              for name in ("cpu_usage_user", "cpu_idle", "disk_written_bytes_per_s")}
    series["memory_cache_usage"] = [gauges(page)["memory_cache_usage"] for page in pages]
    assert gauges(pages[0]).items() <= sent[0]["metrics"].items()
    for name, values in series.items():
        assert f[f"{name}__last"] == pytest.approx(values[-1], rel=1e-9, abs=1e-12), name
        assert f[f"{name}__mean"] == pytest.approx(statistics.fmean(values), rel=1e-9, abs=1e-12), name
        assert f[f"{name}__max"] == pytest.approx(max(values), rel=1e-9, abs=1e-12), name
    assert f["cpu_usage_user__mean"] > 0.2  # the load was seen
    # Prometheus: rate(mode) / rate(all) over the whole span. The window's mean weighs every interval alike; the
    # span's share weighs each by its CPU time, so the intervals' shares weighted by their CPU time must give it
    # (to rounding), whatever the intervals' lengths: a round that overran makes them unequal under this load
    cpu_time = [sum(samples(pages[i], "node_cpu_seconds_total")) - sum(samples(pages[i - 1], "node_cpu_seconds_total"))
                for i in range(1, ROUNDS)]
    for name, modes in SHARES.items():
        shares = [got["metrics"][name] for got in sent[1:]]
        assert f[f"{name}__mean"] == pytest.approx(statistics.fmean(shares), rel=1e-9, abs=1e-12), name
        whole = sum(cpu_share(pages[0], pages[-1], m) for m in modes)
        weighted = sum(v * t for v, t in zip(shares, cpu_time, strict=True)) / sum(cpu_time)
        assert weighted == pytest.approx(whole, rel=1e-9, abs=ROUNDS * share_rounding(pages[0], pages[-1])), name
    assert os.path.exists(tmp_path / "load.bin")
