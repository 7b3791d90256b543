"""Exporter pages for the end-to-end tests: served over HTTP, advanced in time, read independently; a topic read.

The expected values of an end-to-end test must not come from the code under test, so the exposition text
is read with a regular expression (:func:`app.sim.scripted.samples`: no ``prometheus_client``, no mapping)
and CPU shares are computed straight from the counters: Δ(mode, all CPUs) / Δ(all modes, all CPUs).

>>> text = 'node_cpu_seconds_total{cpu="0",mode="idle"} 10\\nnode_cpu_seconds_total{cpu="0",mode="iowait"} 2\\n'
>>> later = advance_cpu(text, {("0", "idle"): 3.0, ("0", "iowait"): 1.0}, dt_s=4.0)
>>> cpu_share(text, later, "iowait")
0.25
>>> samples(later, "node_cpu_seconds_total", mode="idle")
[13.0]
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from aiohttp import web
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord

from app.config import Settings
from app.contracts import contract
from app.sim.scripted import parse_line, samples


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
