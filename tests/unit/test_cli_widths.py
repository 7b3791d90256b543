"""``rttsched sim`` and ``rttsched demo --no-live``: every line within 100 columns, no log noise, intervals
only with two or more seeds. Run in-process; progress bars count as lines (split at carriage returns)."""

from __future__ import annotations

import re

import pytest

from app.cli.main import main

WIDTH = 100


def _lines(text: str) -> list[str]:
    return [line for line in re.split(r"[\r\n]", text) if line]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[str, str]:
    assert main(list(argv)) == 0
    got = capsys.readouterr()
    return got.out, got.err


def test_sim_fits_100_columns_and_shows_intervals_with_two_seeds(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # a wide terminal must not widen anything past 100
    out, err = _run(capsys, "sim", "--tasks", "300", "--seeds", "2", "--out", str(tmp_path),
                    "--policies", "kube_default,static_best,clairvoyant")
    too_wide = [line for line in _lines(out + err) if len(line) > WIDTH]
    assert too_wide == []
    table = out.split("\n\n")[0].splitlines()
    assert table[0].startswith("policy") and "mean RTT ms" in table[0]
    assert [line.split()[0] for line in table[2:5]] == ["kube_default", "static_best", "clairvoyant"]
    assert all("±" in line for line in table[2:5])  # three policies, two seeds each: an interval per cell
    assert "mean over 2 seeds" in out
    assert " INFO " not in err and "WARNING" not in err
    html = (tmp_path / "report.html").read_text()
    assert "95 % interval" in html


def test_demo_offline_one_seed_prints_no_interval(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out, err = _run(capsys, "demo", "--no-live", "--tasks", "300", "--out", str(tmp_path))
    too_wide = [line for line in _lines(out + err) if len(line) > WIDTH]
    assert too_wide == []
    assert "±" not in out and "± 0" not in (tmp_path / "report.html").read_text()
    assert "one seed: means only, no confidence interval" in out
    assert all(len(line) <= 80 for line in _lines(err))  # the progress bar follows a narrower terminal
    for policy in ("kube_default", "static_best", "rtt_aware", "clairvoyant"):
        assert any(line.startswith(policy + " ") for line in out.splitlines()), policy
    assert " INFO " not in err and "WARNING" not in err and "ERROR" not in err
    assert "report: " + str(tmp_path / "report.html") in out
