"""The HTML report in a real browser: headless Chromium (Debian's ``chromium``) driven over the DevTools protocol.

The test renders a report at 1400 px wide, fails on any JavaScript error or console error, on a plot without
an x or a y axis label, on text too small to read and on anything wider than the window, and saves a
full-page screenshot under its tmp dir. A second test shows the checks catch a broken page.

By hand (saves ``reports/report-screenshot.png``, outside git)::

    python3 tests/integration/test_report_render.py [path/to/report.html]
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
WIDTH = 1400
MIN_TEXT_PX = 9.0  # the smallest text on a plot, rendered height in CSS px
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-port=0", "--remote-allow-origins=*", "about:blank")
PROBE = """(() => {
  const box = el => { const r = el.getBoundingClientRect(); return {w: r.width, h: r.height}; };
  const labels = (svg, sel) => [...svg.querySelectorAll(sel)].map(g => ({text: g.textContent.trim(), ...box(g)}));
  const plots = [...document.querySelectorAll('svg')].map(svg => {
    const heights = [...svg.querySelectorAll('text')].map(t => box(t).h).filter(h => h > 0);
    return {id: svg.id, cls: svg.getAttribute('class') || '', ...box(svg), x: labels(svg, '.axis-label.x-label'),
            y: labels(svg, '.axis-label.y-label'), minText: heights.length ? Math.min(...heights) : 0};
  });
  return {plots, scrollWidth: document.documentElement.scrollWidth, height: document.documentElement.scrollHeight,
          title: document.title};
})()"""


@dataclasses.dataclass
class Rendered:
    errors: list[str]
    plots: list[dict[str, Any]]
    scroll_width: float
    height: float
    title: str

    def problems(self) -> list[str]:
        """Everything that makes the page fail: JS errors, unlabelled or unreadable plots, overflow."""
        out = [f"JS error: {e}" for e in self.errors]
        for p in self.plots:
            for axis in ("x", "y"):
                if not any(lab["text"] and lab["w"] > 0 and lab["h"] > 0 for lab in p[axis]):
                    out.append(f"plot {p['id'] or '?'} has no visible {axis} axis label")
            if p["minText"] and p["minText"] < MIN_TEXT_PX:
                out.append(f"plot {p['id']}: text {p['minText']:.1f} px high, below {MIN_TEXT_PX} px")
            if p["w"] > WIDTH:
                out.append(f"plot {p['id']} is {p['w']:.0f} px wide, wider than {WIDTH}")
        if self.scroll_width > WIDTH:
            out.append(f"the page scrolls sideways: {self.scroll_width:.0f} px at {WIDTH} px")
        return out


async def _render(url: str, png: Path, chromium: str) -> Rendered:
    import aiohttp

    with tempfile.TemporaryDirectory(prefix="rttsched-chromium-", ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen([chromium, *FLAGS[:-1], f"--user-data-dir={profile}", FLAGS[-1]],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + 30
            while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"chromium did not open its DevTools port (exit code {proc.poll()})")
                await asyncio.sleep(0.05)
            port = int(port_file.read_text().split()[0])
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                    page = next(t for t in await r.json() if t["type"] == "page")
                async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    return await _drive(ws, url, png)
        finally:
            _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to chromium's own process group (its zygote and renderers too), SIGKILL after 10 s."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
        deadline = time.monotonic() + wait_s  # the group's other members go with it
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


async def _drive(ws: Any, url: str, png: Path) -> Rendered:
    ids = iter(range(1, 1_000_000))
    errors: list[str] = []
    loaded = asyncio.Event()

    async def call(method: str, **params: Any) -> dict[str, Any]:
        my = next(ids)
        await ws.send_json({"id": my, "method": method, "params": params})
        while True:
            msg = await asyncio.wait_for(ws.receive_json(), 60)
            if msg.get("id") == my:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            _event(msg)

    def _event(msg: dict[str, Any]) -> None:
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = params["exceptionDetails"]
            errors.append(d.get("exception", {}).get("description") or d.get("text", "exception"))
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            errors.append(params["entry"].get("text", "error"))
        elif method == "Page.loadEventFired":
            loaded.set()

    for domain in ("Page", "Runtime", "Log"):
        await call(f"{domain}.enable")
    await call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=900, deviceScaleFactor=1, mobile=False)
    await call("Page.navigate", url=url)
    while not loaded.is_set():
        _event(await asyncio.wait_for(ws.receive_json(), 60))
    await call("Runtime.evaluate", expression="new Promise(r => setTimeout(r, 200))", awaitPromise=True)
    probe = (await call("Runtime.evaluate", expression=PROBE, returnByValue=True))["result"]["value"]
    shot = await call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                      clip={"x": 0, "y": 0, "width": WIDTH, "height": probe["height"], "scale": 1})
    png.write_bytes(base64.b64decode(shot["data"]))
    return Rendered(errors, probe["plots"], probe["scrollWidth"], probe["height"], probe["title"])


def render(html: Path, png: Path) -> Rendered:
    """Open ``html`` in headless Chromium at :data:`WIDTH` px, probe it and save a full-page screenshot."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise RuntimeError("chromium not found: apt-get install chromium (bash .ci/run does)")
    return asyncio.run(_render(html.resolve().as_uri(), png, chromium))


def explained_example() -> dict[str, Any]:
    """A real explanation: a small reg:gamma model over three nodes, one of them blocked by anti-affinity."""
    import numpy as np
    import xgboost

    from app.model.fast import FastPredictor
    from app.scheduler.assumed import AssumedPods
    from app.scheduler.builder import SnapshotBuilder
    from app.scheduler.decide import DecideParams
    from app.scheduler.explain import explain
    from app.scheduler.podinfo import PodInfo
    from app.scheduler.policy import policy_from_dict

    rng = np.random.default_rng(1)
    X = np.column_stack([rng.uniform(0, 4, 800), rng.uniform(50, 900, 800)]).astype(np.float32)
    y = 40 * np.exp(0.4 * X[:, 0]) * (1 + 0.001 * X[:, 1])
    names = ("load__mean", "task_input_size_mb")
    booster = xgboost.train({"objective": "reg:gamma", "max_depth": 3, "nthread": 1},
                            xgboost.DMatrix(X, label=y, feature_names=list(names)), 30)
    b = SnapshotBuilder()
    for node, model, load in (("worker-1", "Tesla K20c", 3.0), ("worker-2", "Tesla M40", 1.5),
                              ("worker-3", "RTX 4090", 0.5)):
        b.apply_node_features({"node": node, "ts": 99.0, "node_class": "gpu", "gpu_model": model, "window_s": 30.0,
                               "count": 30, "features": {"load__mean": load}})
        b.apply_node_weights({"node": node, "ts": 99.0, "weight": 0.7, "predicted_rtt_ms": {}, "stale": False})
    b.set_model("gCTF:gpu", 4, FastPredictor.from_booster(booster, names))
    assumed = AssumedPods()
    assumed.assume("uid-0", "Motioncor2", "worker-3", now=99.5)
    params = DecideParams(policy_from_dict({"anti_affinity": [["gCTF", "Motioncor2"]]}))
    pod = PodInfo("gctf-7", "em", "uid-7", "gCTF", 400.0)
    return explain(b.build(now=100.0), pod, ["worker-1", "worker-2", "worker-3"], assumed, params, 100.0,
                   lambda key, version: booster)


def build_report(out: Path) -> Path:
    """A small real comparison: baselines, rtt_aware and the clairvoyant over two seeds, plus rtt_aware's first
    run shown as a live row (so the live title, goals and over-time plots are drawn too), and an explanation."""
    from app.sim.report import hardware_labels, write_report
    from app.sim.runner import SimConfig, describe, run_offline

    cfg = SimConfig(n_tasks=900)
    runs = {p: [run_offline(cfg, p, s) for s in (1, 2)] for p in ("kube_default", "load_aware", "rtt_aware",
                                                                   "clairvoyant")}
    live = {"rtt_aware_live": [dataclasses.replace(runs["rtt_aware"][0], policy="rtt_aware_live")]}
    return write_report({**live, **runs}, out, describe(cfg), live=set(live), hardware=hardware_labels(cfg),
                        explained=[explained_example()]).html


def test_report_renders_in_chromium_with_labelled_readable_plots(tmp_path: Path) -> None:
    html = build_report(tmp_path / "report")
    png = tmp_path / "report.png"
    page = render(html, png)
    assert page.problems() == []
    plots = [p for p in page.plots if "plot" in p["cls"].split()]
    ids = {p["id"] for p in plots}
    assert {"cdf", "time", "pvo", "err0", "w0"} <= ids, ids  # distribution, over time, learning plots
    assert all(p["h"] > 150 for p in plots)
    assert "live" in page.title
    text = html.read_text()
    assert "Placements explained" in text and "anti-affinity: gCTF interferes with Motioncor2" in text
    assert png.stat().st_size > 50_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_checks_catch_a_js_error_and_an_unlabelled_plot(tmp_path: Path) -> None:
    from app.sim.report.svg import new_figure, to_svg

    fig, (ax,) = new_figure(4, 3)
    ax.plot([1, 2], [2, 1])
    ax.set_xlabel("time (s)")  # no y label
    page = tmp_path / "bad.html"
    page.write_text(f"<!doctype html><html><body>{to_svg(fig, 'bad', 'no y label')}"
                    "<script>undefinedFunction()</script></body></html>")
    problems = render(page, tmp_path / "bad.png").problems()
    assert any(p.startswith("JS error") and "undefinedFunction" in p for p in problems), problems
    assert "plot bad has no visible y axis label" in problems
    assert not any("no visible x axis label" in p for p in problems)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else build_report(ROOT / "reports" / "render-check")
    shot = ROOT / "reports" / "report-screenshot.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    result = render(target, shot)
    print(f"{target}: {len(result.plots)} plots, {result.height:.0f} px high; screenshot {shot}")
    for line in result.problems() or ["no problems"]:
        print(" ", line)
