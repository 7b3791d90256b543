"""Helpers of the bridge tests: fixture paths, an independent tiny exposition reader, and assembling helpers."""

from __future__ import annotations

import re
from pathlib import Path

from app.bridge.mapping import load_mapping
from app.bridge.snapshot import NodeAssembler, Snapshot, TargetResult
from app.bridge.targets import Endpoint, Target

REPO = Path(__file__).resolve().parents[3]
EXPORTERS = REPO / "tests" / "fixtures" / "exporters"
SPANS = REPO / "tests" / "fixtures" / "spans"

NODE_A = EXPORTERS / "node_exporter-1.5.0.scrape-a.prom"
NODE_B = EXPORTERS / "node_exporter-1.5.0.scrape-b.prom"
DCGM_A = EXPORTERS / "dcgm-exporter-3.3.5.rtx4090.scrape-a.prom"  # 2x RTX 4090
DCGM_B = EXPORTERS / "dcgm-exporter-3.3.5.rtx4090.scrape-b.prom"
DCGM_WATCHDOG = EXPORTERS / "dcgm-exporter-3.3.5.rtx4090.watchdog.prom"
M40_A = EXPORTERS / "dcgm-exporter-3.3.5.m40.scrape-a.prom"
M40_B = EXPORTERS / "dcgm-exporter-3.3.5.m40.scrape-b.prom"
A100_A = EXPORTERS / "dcgm-exporter-3.3.5-dcp.a100.scrape-a.prom"
A100_B = EXPORTERS / "dcgm-exporter-3.3.5-dcp.a100.scrape-b.prom"
NVIDIA_A = EXPORTERS / "nvidia_gpu_exporter-1.2.1.k20c.scrape-a.prom"  # 1x Tesla K20c
NVIDIA_B = EXPORTERS / "nvidia_gpu_exporter-1.2.1.k20c.scrape-b.prom"
NVIDIA_FAILED = EXPORTERS / "nvidia_gpu_exporter-1.2.1.k20c.failed.prom"
NVIDIA_HUNG = EXPORTERS / "nvidia_gpu_exporter-1.12.0.rtx4090.hung.prom"
STREAMS = EXPORTERS / "workload-cuda-streams.prom"
PROVENANCE = EXPORTERS / "PROVENANCE.yaml"

NODE_URL = "http://10.0.0.13:9100/metrics"
DCGM_URL = "http://10.0.0.13:9400/metrics"
NVIDIA_URL = "http://10.0.0.13:9835/metrics"
STREAMS_URL = "http://10.0.0.13:9102/metrics"
GAP_S = 8.4  # between the two real node_exporter captures (node_time_seconds), and the GPU captures

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')


def raw_samples(path: Path, name: str) -> list[tuple[dict[str, str], float]]:
    """Samples of ``name`` read straight from the text, without prometheus_client (the test's own parse)."""
    out = []
    for line in path.read_text().splitlines():
        m = _LINE.match(line)
        if m and m.group(1) == name:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            out.append((labels, float(m.group(3))))
    return out


def raw_sum(path: Path, name: str, **labels: str) -> float:
    return sum(v for lab, v in raw_samples(path, name) if all(lab.get(k) == x for k, x in labels.items()))


def with_value(text: str, series: str, value: float | str) -> str:
    """``text`` with the sample line of ``series`` (name and labels, as written) set to ``value``."""
    lines = [f"{series} {value}" if line.startswith(series + " ") else line for line in text.splitlines()]
    assert lines != text.splitlines(), series
    return "\n".join(lines) + "\n"


def assembler(*urls: str, node: str = "worker-3", node_class: str | None = None,
              optional: tuple[str, ...] = ()) -> NodeAssembler:
    target = Target(node, tuple(Endpoint(u, optional=u in optional) for u in urls), node_class)
    return NodeAssembler(target, load_mapping())


def ok(url: str, path: Path | str, t: float) -> TargetResult:
    return TargetResult(url, t, path.read_text() if isinstance(path, Path) else path)


def failed(url: str, t: float, error: str = "ClientConnectorError: connection refused") -> TargetResult:
    return TargetResult(url, t, None, error)


def two_rounds(a: NodeAssembler, first: list[TargetResult], second: list[TargetResult]) -> Snapshot:
    a.assemble(first, 1000.0)
    return a.assemble(second, 1000.0 + GAP_S)


def gpu_node(first: Path, second: Path, url: str = DCGM_URL) -> Snapshot:
    """The second snapshot of a node scraped only through one GPU exporter, ``GAP_S`` apart."""
    return two_rounds(assembler(url), [ok(url, first, 0.0)], [ok(url, second, GAP_S)])


class ExporterServer:
    """A real HTTP server on a free port; each path answers its scripted replies in turn (the last repeats).

    A reply is a file (served as text), a string, an int (that HTTP status) or a float (seconds to stall).
    """

    def __init__(self, routes: dict[str, list[Path | str | int | float]]) -> None:
        self.routes = routes
        self.hits: dict[str, int] = {p: 0 for p in routes}
        self._runner = None
        self.base = ""

    async def _handle(self, request):  # noqa: ANN001, ANN202
        import asyncio

        from aiohttp import web

        replies = self.routes[request.path]
        reply = replies[min(self.hits[request.path], len(replies) - 1)]
        self.hits[request.path] += 1
        if isinstance(reply, float):
            await asyncio.sleep(reply)
            return web.Response(text="")
        if isinstance(reply, int):
            return web.Response(status=reply, text="error")
        text = reply.read_text() if isinstance(reply, Path) else reply
        return web.Response(text=text, content_type="text/plain")

    async def __aenter__(self) -> ExporterServer:
        from aiohttp import web

        app = web.Application()
        for path in self.routes:
            app.router.add_get(path, self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def url(self, path: str) -> str:
        return self.base + path
