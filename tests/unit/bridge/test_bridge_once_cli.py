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


@pytest.fixture
def exporter() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            ok = self.path == "/metrics"
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(PAGE if ok else b"not here")

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
    assert "gone: scrape_failed from an exporter not identified yet: HTTP 404" in warned


def test_once_with_every_node_answering_exits_zero(exporter, monkeypatch, capsys):
    monkeypatch.setenv("RTT_SCRAPE_INTERVAL_S", "0.2")
    assert main(["bridge", "--target", f"node=good,url={exporter}/metrics", "--once"]) == 0
    assert "no metrics" not in capsys.readouterr().err
