"""bench/bench_update_latency.py pairs a demo's log lines as the calibration of the simulated trainer needs."""

from __future__ import annotations

from pathlib import Path

import bench_update_latency as bul
import pytest

from app.sim.policies.training import VerdictDelay

WORKER = """\
2026-12-05 00:52:22,073 INFO feedback_errors: retrain-event gCTF:gpu (cold_start): cumulative 47.000 > 25.000
2026-12-05 00:52:22,074 INFO feedback_errors: retrain-event Motioncor2:gpu (cold_start): cumulative 36.000 > 25.000
2026-12-05 00:52:22,574 INFO feedback_errors: retrain-event Motioncor2:gpu (cold_start): cumulative 72.000 > 25.000
2026-12-05 00:52:26,076 INFO feedback_errors: retrain-event upload:cpu (growth): cumulative 105.000 > 100.500
2026-12-05 00:53:40,000 INFO feedback_errors: retrain-event gCTF:gpu (growth): cumulative 900.000 > 800.000
"""
TRAINER = """\
2026-12-05 00:52:22,144 INFO pipeline: challenger gpu: 37 fit rows
2026-12-05 00:52:22,147 INFO service: retrain of gCTF:gpu (cold_start): no_champion
2026-12-05 00:52:22,157 INFO pipeline: challenger gpu: 28 fit rows
2026-12-05 00:52:22,160 INFO service: retrain of Motioncor2:gpu (cold_start): no_champion
2026-12-05 00:52:26,200 INFO pipeline: challenger cpu: 84 fit rows
2026-12-05 00:52:26,201 INFO service: retrain of upload:cpu (growth): not_better
2026-12-05 00:53:41,000 INFO pipeline: challenger gpu: 720 fit rows
2026-12-05 00:53:41,010 INFO service: retrain of gCTF:gpu (growth): better
"""
EXTENDER = """\
rttsched extender: listening on http://127.0.0.1:38411
2026-12-05 00:52:23,180 INFO app.extender.models: model gCTF:gpu v1 installed (6 features)
2026-12-05 00:52:23,230 INFO app.extender.service: model gCTF:gpu v1 serving
2026-12-05 00:52:23,500 INFO app.extender.models: model Motioncor2:gpu v1 installed (6 features)
2026-12-05 00:53:41,400 INFO app.extender.models: model gCTF:gpu v2 installed (9 features)
2026-12-05 00:53:41,480 INFO app.extender.service: model gCTF:gpu v2 serving
"""


def _demo(root: Path) -> Path:
    logs = root / "demo" / "logs"
    logs.mkdir(parents=True)
    for name, text in (("worker", WORKER), ("trainer", TRAINER), ("extender", EXTENDER)):
        (logs / f"{name}.log").write_text(text)
    return root / "demo"


def test_each_event_is_paired_with_its_own_verdict_and_install(tmp_path):
    got = {(u.key, u.reason, u.fit_rows): u for u in bul.updates(_demo(tmp_path))}
    # the second Motioncor2 ask came while the first was training: no verdict of its own, left out
    assert sorted(got) == [("Motioncor2:gpu", "cold_start", 28), ("gCTF:gpu", "cold_start", 37),
                           ("gCTF:gpu", "growth", 720), ("upload:cpu", "growth", 84)]
    assert got["gCTF:gpu", "cold_start", 37].to_installed_s == pytest.approx(1.107, abs=1e-3)
    assert got["gCTF:gpu", "cold_start", 37].to_verdict_s == pytest.approx(0.074, abs=1e-3)
    assert got["Motioncor2:gpu", "cold_start", 28].to_installed_s == pytest.approx(1.426, abs=1e-3)
    assert got["upload:cpu", "growth", 84].to_installed_s is None  # not promoted: nothing installed
    assert got["gCTF:gpu", "growth", 720].to_installed_s == pytest.approx(1.4, abs=1e-3)  # v2, not v1 again


def test_serving_is_paired_by_key_and_version_and_stands_for_the_install_where_logged(tmp_path):
    got = {(u.key, u.reason): u for u in bul.updates(_demo(tmp_path))}
    assert got["gCTF:gpu", "cold_start"].to_serving_s == pytest.approx(1.157, abs=1e-3)  # v1's line, not v2's
    assert got["gCTF:gpu", "growth"].to_serving_s == pytest.approx(1.48, abs=1e-3)
    assert got["gCTF:gpu", "growth"].served_s == got["gCTF:gpu", "growth"].to_serving_s
    motioncor2 = got["Motioncor2:gpu", "cold_start"]  # no serving line (an older extender): the install time
    assert motioncor2.to_serving_s is None and motioncor2.served_s == motioncor2.to_installed_s
    assert got["upload:cpu", "growth"].served_s is None


def test_the_bands_are_printed_beside_the_simulated_delay(tmp_path, capsys):
    assert bul.main([str(_demo(tmp_path))]) == 0
    out = capsys.readouterr().out
    below = next(line for line in out.splitlines() if line.startswith("< 500"))
    above = next(line for line in out.splitlines() if line.startswith(">= 500"))
    n, lo, med, hi, simulated, ratio = below.split()[2:]
    assert (int(n), float(lo), float(med), float(hi)) == (2, 1.16, 1.29, 1.43)  # gCTF serving, Motioncor2 installed
    expected = (VerdictDelay()(bul._rows_for(37)) + VerdictDelay()(bul._rows_for(28))) / 2
    assert float(simulated) == pytest.approx(expected, abs=0.005)
    assert float(ratio) == pytest.approx(1.2915 / expected, abs=0.01)
    assert above.split()[2] == "1" and float(above.split()[6]) == pytest.approx(VerdictDelay()(900), abs=0.005)


def test_the_rows_of_a_fit_set_follow_the_plain_split():
    for fit in (20, 37, 499, 500, 720, 40_000):
        n = bul._rows_for(fit)
        assert n - -(-n * 2 // 10) >= fit > (n - 1) - -(-(n - 1) * 2 // 10)


def test_a_folder_that_is_not_a_demo_run_is_named(tmp_path):
    with pytest.raises(SystemExit, match="worker.log not found"):
        bul.main([str(tmp_path)])
