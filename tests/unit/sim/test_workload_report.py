from __future__ import annotations

import csv

import numpy as np
import orjson
import pytest

from app.sim.report import write_report
from app.sim.runner import SimConfig, run_offline
from app.sim.workload import TraceError, bursty_workload, poisson_workload, trace_workload, write_trace


def test_trace_round_trip_and_jsonl(tmp_path):
    w = poisson_workload(np.random.default_rng(3), 200, 20.0)
    path = tmp_path / "t.csv"
    write_trace(w, path)
    back = trace_workload(path, np.random.default_rng(0))
    assert back.apps == w.apps
    assert np.allclose(back.arrival_s, w.arrival_s - w.arrival_s[0], atol=1e-6)
    jl = tmp_path / "t.jsonl"
    jl.write_text('{"ts": 5, "app": "gCTF", "input_size_mb": 50}\n{"ts": 2, "app": "upload", "input_size_mb": 9}\n')
    t = trace_workload(jl, np.random.default_rng(0))
    assert t.apps == ("upload", "gCTF") and t.arrival_s.tolist() == [0.0, 3.0]
    m = run_offline(SimConfig(n_tasks=200, arrivals="trace", trace_path=str(path)), "clairvoyant", 1)
    assert int(m.summary()["tasks"]) == 200


def test_bad_trace_rows_are_reported(tmp_path):
    bad = tmp_path / "b.csv"
    bad.write_text("ts,app,input_size_mb\n1,nope,3\n")
    with pytest.raises(TraceError, match="row 1"):
        trace_workload(bad, np.random.default_rng(0))


def test_bursty_keeps_the_long_run_rate():
    w = bursty_workload(np.random.default_rng(9), 20000, 50.0)
    rate = len(w) / w.duration_s
    assert 40.0 < rate < 60.0
    gaps = np.diff(w.arrival_s)
    assert gaps.std() / gaps.mean() > 1.1  # burstier than Poisson (CV 1)


def test_report_files(tmp_path):
    cfg = SimConfig(n_tasks=300)
    runs = {p: [run_offline(cfg, p, s) for s in (1, 2)] for p in ("kube_default", "clairvoyant")}
    paths = write_report(runs, tmp_path, {"n_tasks": 300})
    rows = list(csv.DictReader(paths.csv.read_text().splitlines()))
    assert {r["policy"] for r in rows} == {"kube_default", "clairvoyant"}
    doc = orjson.loads(paths.json.read_bytes())
    assert doc["seeds"] == [1, 2] and "mean_rtt_ms" in doc["policies"]["clairvoyant"]
    assert doc["policies"]["clairvoyant"]["mean_rtt_ms"]["n"] == 2
    html = paths.html.read_text()
    assert '<svg class="plot"' in html and "clairvoyant" in html
    assert "RTT over time (seed 1, the first of 2)" in html  # the plots over time show one seed, and say which
    assert "<dt>clairvoyant</dt><dd>a reference, not a competitor" in html  # each row says what it is
    assert "<dt>kube_default</dt>" in html and "<dt>static_best</dt>" not in html  # the rows of this report only

