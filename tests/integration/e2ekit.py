"""Helpers of the end-to-end pipeline test: exporter pages over HTTP, the text read independently, a worker.

The expected values of an end-to-end test must not come from the code under test, so the exposition text
is read here with a regular expression (no ``prometheus_client``, no mapping) and CPU shares are computed
straight from the counters: Δ(mode, all CPUs) / Δ(all modes, all CPUs).

>>> text = 'node_cpu_seconds_total{cpu="0",mode="idle"} 10\\nnode_cpu_seconds_total{cpu="0",mode="iowait"} 2\\n'
>>> later = advance_cpu(text, {("0", "idle"): 3.0, ("0", "iowait"): 1.0}, dt_s=4.0)
>>> cpu_share(text, later, "iowait")
0.25
>>> samples(later, "node_cpu_seconds_total", mode="idle")
[13.0]
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from aiohttp import web
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord

from app.cli.processes import ProcessGroup
from app.config import Settings
from app.contracts import contract
from app.kafka.embedded import free_port

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_line(line: str) -> tuple[str, dict[str, str], float] | None:
    """``(name, labels, value)`` of one sample line; None for comments and blank lines."""
    m = _SAMPLE.match(line.strip())
    if not m or line.startswith("#"):
        return None
    return m.group(1), dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))


def samples(text: str, name: str, **labels: str) -> list[float]:
    """Values of ``name``'s samples whose labels include ``labels``, in the order of the text."""
    out = []
    for line in text.splitlines():
        parsed = parse_line(line)
        if parsed and parsed[0] == name and all(parsed[1].get(k) == v for k, v in labels.items()):
            out.append(parsed[2])
    return out


def cpu_share(before: str, after: str, mode: str) -> float:
    """Δ ``node_cpu_seconds_total{mode}`` over all CPUs / Δ of every mode over all CPUs."""
    name = "node_cpu_seconds_total"
    part = sum(samples(after, name, mode=mode)) - sum(samples(before, name, mode=mode))
    return part / (sum(samples(after, name)) - sum(samples(before, name)))


def advance_cpu(text: str, deltas: Mapping[tuple[str, str], float], dt_s: float) -> str:
    """A later node_exporter page: ``node_cpu_seconds_total{cpu, mode}`` += ``deltas[(cpu, mode)]``,
    ``node_time_seconds`` += ``dt_s``; every other line as it was."""
    out = []
    for line in text.splitlines():
        parsed = parse_line(line)
        if parsed is not None:
            name, labels, value = parsed
            if name == "node_cpu_seconds_total":
                line = line.rsplit(" ", 1)[0] + f" {value + deltas.get((labels['cpu'], labels['mode']), 0.0)!r}"
            elif name == "node_time_seconds":
                line = f"node_time_seconds {value + dt_s!r}"
        out.append(line)
    return "\n".join(out) + "\n"


@contextlib.asynccontextmanager
async def serve_pages(routes: Mapping[str, list[str]]) -> AsyncIterator[dict[str, str]]:
    """An HTTP server on a free port serving each path's pages in turn (the last one repeats)."""
    hits = dict.fromkeys(routes, 0)

    async def handle(request: web.Request) -> web.Response:
        pages = routes[request.path]
        body = pages[min(hits[request.path], len(pages) - 1)]
        hits[request.path] += 1
        return web.Response(text=body, content_type="text/plain")

    app = web.Application()
    for path in routes:
        app.router.add_get(path, handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield {p: base + p for p in routes}
    finally:
        await runner.cleanup()


def start_worker(group: ProcessGroup, s: Settings, name: str = "worker", **env: str) -> str:
    """Start ``rttsched worker`` (a subprocess of ``group``) on ``s``; its /metrics URL once it answers."""
    port = free_port()
    group.start(name, ["worker", "--session-timeout-s", "6", "--datadir", str(group.log_dir / "faust")], env={
        "RTT_KAFKA_BOOTSTRAP": s.bootstrap_servers, "RTT_TOPIC_PREFIX": s.topic_prefix,
        "RTT_METRICS_PORT": str(port), "RTT_FEATURE_EMIT_INTERVAL_S": "0.2", **env,
    })
    url = f"http://127.0.0.1:{port}/metrics"
    group.wait_http(name, url, timeout_s=40)
    return url


async def read_until(s: Settings, topic: str, done: Callable[[list[ConsumerRecord[Any, Any]]], bool],
                     timeout_s: float = 25.0) -> list[ConsumerRecord[Any, Any]]:
    """Records of contract ``topic`` (every partition, from the start, no group) until ``done(records)``."""
    c = AIOKafkaConsumer(bootstrap_servers=s.bootstrap_servers, auto_offset_reset="earliest",
                         enable_auto_commit=False, group_id=None)
    await c.start()
    name = s.topic(topic)
    c.assign([TopicPartition(name, p) for p in range(contract(topic).partitions)])
    seen: list[ConsumerRecord[Any, Any]] = []
    try:
        deadline = time.monotonic() + timeout_s
        while not done(seen):
            assert time.monotonic() < deadline, f"{topic}: condition not met in {timeout_s}s; last {seen[-3:]}"
            batch = await c.getmany(timeout_ms=200)
            seen.extend(m for msgs in batch.values() for m in msgs)
        return seen
    finally:
        await c.stop()
