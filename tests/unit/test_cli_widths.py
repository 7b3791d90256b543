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
    for policy in ("kube_default", "static_best", "load_aware_tuned", "target_load_tuned", "rtt_aware", "clairvoyant"):
        assert any(line.startswith(policy + " ") for line in out.splitlines()), policy
    assert " INFO " not in err and "WARNING" not in err and "ERROR" not in err
    assert "report: " + str(tmp_path / "report.html") in out


def _wide_agg(policies: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    """Long policy names and four-digit means with four-digit intervals on every terminal figure."""
    figs = {"mean_rtt_ms": 1232.9, "p95_rtt_ms": 5140.9, "p99_rtt_ms": 16510.7, "sla": 0.654, "gpu_util": 0.569,
            "throughput": 118.4, "failed": 1234.5, "tasks": 3765.5}
    ci = {"mean_rtt_ms": 1046.0, "p95_rtt_ms": 1340.0, "p99_rtt_ms": 12950.0, "sla": 0.064, "gpu_util": 0.247,
          "throughput": 11.4, "failed": 1001.0, "tasks": 1001.0}
    return {p: {f: {"mean": v, "ci95": ci[f], "n": 3.0} for f, v in figs.items()} for p in policies}


def test_a_table_too_wide_for_100_columns_goes_on_in_a_second_block_not_past_the_edge():
    """The summary's table was printed as built: wide intervals took its lines past 100 columns."""
    from app.cli.summary import summary_lines
    from app.sim.policies import POLICY_NAMES

    lines = summary_lines(_wide_agg(list(POLICY_NAMES)), [])
    assert max(map(len, lines)) <= WIDTH
    text = "\n".join(lines)
    assert "..." not in text  # nothing cut: every cell is there, in one block or the next
    for value in ("1233 ± 1046", "5141 ± 1340", "16511 ± 12950", "0.654 ± 0.064", "0.569 ± 0.247", "118.4 ± 11",
                  "1234 ± 1001"):
        assert text.count(value) == len(POLICY_NAMES), value
    heads = [line for line in lines if line.startswith("policy ")]
    assert len(heads) == 2  # the second block repeats the policy column
    assert all(any(line.startswith(p + " ") for line in lines) for p in POLICY_NAMES)


def test_the_demo_s_live_line_counts_placement_attempts_that_add_up():
    """It said "N prioritize calls" of the extender's placement attempts, which also count the tasks bound after
    filter alone and those filter left pending: its scored, neutral and errors did not add up to N."""
    from app.cli.summary import live_lines

    live = {"extender": {"requests": 20.0, "scored": 12.0, "neutral": 3.0, "errors": 1.0, "bound": 2.0,
                         "filtered_out": 2.0, "http_s": 0.5},
            "retrain_events": 4, "model_updates": 3, "predictions_joined": 15}
    lines = live_lines(live, {"rtt_aware_live": (100.0, 110.0, 90.0)}, "rtt_aware_live", {})
    text = "\n".join(lines)
    assert "prioritize calls" not in text
    counts = re.findall(r"(\d+) (scored|neutral|errors|bound|left pending)", text)
    assert [n for n, _ in counts] == ["12", "3", "1", "2", "2"]
    assert "20 placement attempts" in text and sum(int(n) for n, _ in counts) == 20
    assert max(map(len, lines)) <= WIDTH


def test_the_demo_s_mean_rtt_rows_keep_their_columns_for_the_longest_policy_name():
    """``target_load_tuned`` (17 characters) ran into its first figure, one column off the others."""
    from app.cli.summary import live_lines

    live = {"extender": {}, "retrain_events": 0, "model_updates": 0, "predictions_joined": 0}
    halves = {"rtt_aware_live": (132.1, 153.4, 110.9), "target_load_tuned": (159.1, 169.0, 149.1)}
    rows = [line for line in live_lines(live, halves, "rtt_aware_live", {}) if line.lstrip().startswith(
        ("mean RTT", "rtt_aware_live", "target_load_tuned"))]
    assert len(rows) == 3
    assert len({line.index("all tasks") + len("all tasks") for line in rows[:1]}
               | {line.index(f) + len(f) for line, f in zip(rows[1:], ("132.1", "159.1"), strict=True)}) == 1
    assert "target_load_tuned " in rows[2]
