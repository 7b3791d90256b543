"""``rttsched bridge --once`` against a local HTTP server: the snapshots printed, and a node without metrics
is an error that says which (the warning above it says why)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from app.cli.main import main

EXPORTERS = Path(__file__).resolve().parents[2] / "fixtures" / "exporters"
PAGE = (EXPORTERS / "node_exporter-1.5.0.scrape-a.prom").read_bytes()
LANDING = b"<html><head><title>Node Exporter</title></head><body><a href='/metrics'>Metrics</a></body></html>"


@pytest.fixture
def exporter() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            ok = self.path in ("/metrics", "/")
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4" if self.path == "/metrics" else "text/html")
            self.end_headers()
            self.wfile.write({"/metrics": PAGE, "/": LANDING}.get(self.path, b"not here"))

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_once_prints_each_node_and_fails_naming_the_one_without_metrics(exporter, monkeypatch, capsys, caplog):
    monkeypatch.setenv("RTT_SCRAPE_INTERVAL_S", "0.2")
    with caplog.at_level(logging.WARNING, logger="app.bridge.scraper"):
        rc = main(["bridge", "--target", f"node=good,url={exporter}/metrics",
                   "--target", f"node=gone,url={exporter}/nosuch", "--once"])
    out, err = capsys.readouterr()
    snaps = {s["node"]: s for s in map(json.loads, out.splitlines())}
    assert set(snaps) == {"good", "gone"} and snaps["good"]["metrics"] and not snaps["gone"]["metrics"]
    assert rc == 1 and "no metrics from gone (the warning" in err and "good" not in err
    warned = [r.getMessage() for r in caplog.records]
    assert (f"gone: scrape_failed from an exporter not identified yet at {exporter}/nosuch: HTTP 404; withholding "
            "cpu, memory, node") in warned
    assert snaps["gone"]["stale"] == ["cpu", "memory", "node"]  # no metric: never a fresh, idle-looking node


def test_once_with_every_node_answering_exits_zero(exporter, monkeypatch, capsys):
    monkeypatch.setenv("RTT_SCRAPE_INTERVAL_S", "0.2")
    assert main(["bridge", "--target", f"node=good,url={exporter}/metrics", "--once"]) == 0
    assert "no metrics" not in capsys.readouterr().err


def test_once_warns_about_a_page_without_metrics_and_marks_the_node_stale(exporter, monkeypatch, capsys, caplog):
    # node_exporter's landing page answers 200: it is a failed scrape, and the node no idle-looking fresh one
    monkeypatch.setenv("RTT_SCRAPE_INTERVAL_S", "0.2")
    with caplog.at_level(logging.WARNING, logger="app.bridge.scraper"):
        rc = main(["bridge", "--target", f"node=w1,class=gpu,url={exporter}/,exporter=node_exporter", "--once"])
    out, err = capsys.readouterr()
    [snap] = map(json.loads, out.splitlines())
    assert rc == 1 and snap["metrics"] == {} and snap["stale"] == ["cpu", "gpu", "memory", "node"]
    assert "no metrics from w1" in err
    warned = [r.getMessage() for r in caplog.records]
    assert any(w.startswith(f"w1: scrape_failed from node_exporter at {exporter}/: HTTP 200 without any metric "
                            "the bridge reads")
               and w.endswith("; withholding cpu, memory, node") for w in warned), warned


def test_once_with_an_exporter_that_never_answered_marks_every_group_stale(monkeypatch, capsys):
    from app.kafka.embedded import free_port

    monkeypatch.setenv("RTT_SCRAPE_INTERVAL_S", "0.2")
    rc = main(["bridge", "--target", f"node=worker-1,class=gpu,url=http://127.0.0.1:{free_port()}/metrics", "--once"])
    [snap] = map(json.loads, capsys.readouterr().out.splitlines())
    assert rc == 1 and snap["metrics"] == {} and snap["stale"] == ["cpu", "gpu", "memory", "node"]


@pytest.mark.parametrize(("args", "message"), [
    (["--target", "node=w1,url=http://127.0.0.1:9/metrics,exporter=dcgm"],
     "--target 'node=w1,url=http://127.0.0.1:9/metrics,exporter=dcgm', exporter: unknown exporter 'dcgm' "
     "(known: node_exporter, dcgm_exporter, nvidia_gpu_exporter)"),
    (["--target", "node=${NODE_NAME},url=http://127.0.0.1:9/metrics"],
     "--target 'node=${NODE_NAME},url=http://127.0.0.1:9/metrics', node: ${NODE_NAME} is not expanded in "
     "--target: give the value, or use a targets file"),
    (["--target", "node=worker 1,url=http://127.0.0.1:9/metrics"], "node: must be a Kubernetes node name"),
])
def test_bad_targets_stop_the_bridge_at_start_with_one_line(capsys, args, message):
    assert main(["bridge", *args, "--once"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and message in err and "Traceback" not in err


def test_a_misspelt_exporter_in_a_targets_file_stops_the_bridge_at_start(tmp_path, capsys):
    p = tmp_path / "targets.yaml"
    p.write_text("node: w1\nclass: gpu\ntargets:\n  - {url: 'http://127.0.0.1:9/f/missing.prom', exporter: dcgm}\n")
    assert main(["bridge", "--targets", str(p), "--once"]) == 2
    err = capsys.readouterr().err
    assert err == (f"rttsched bridge: error: {p}.targets[0].exporter: unknown exporter 'dcgm' "
                   "(known: node_exporter, dcgm_exporter, nvidia_gpu_exporter)\n")
