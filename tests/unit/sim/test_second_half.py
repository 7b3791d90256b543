"""bench/bench_policies.py's second-half summary: rtt_aware after the models' warm-up against the best baseline."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from bench_policies import jsonable, markdown, second_half


def run(first: float, second: float, n: int = 10) -> SimpleNamespace:
    """A run whose first half of the tasks took ``first`` ms each and whose second half ``second`` ms."""
    rtt = np.array([first] * (n // 2) + [second] * (n - n // 2))
    return SimpleNamespace(apps=("a",) * n, rtt_ms=rtt, ok=np.ones(n, dtype=bool))


def test_the_warm_up_is_left_out_and_the_best_baseline_is_the_best_there() -> None:
    runs = {
        "rtt_aware": [run(300.0, 80.0), run(310.0, 82.0), run(290.0, 78.0)],  # slow while it learns
        "static_best": [run(90.0, 100.0), run(90.0, 104.0), run(90.0, 96.0)],  # best over the whole run
        "kube_default": [run(150.0, 95.0), run(150.0, 95.0), run(150.0, 95.0)],  # best over the second half
        "clairvoyant": [run(70.0, 75.0), run(70.0, 77.0), run(70.0, 73.0)],
    }
    late = second_half(runs)["mean_rtt_ms"]
    assert late["best_name"] == "kube_default"
    assert late["rtt_aware"] == pytest.approx(80.0)
    assert late["best"][0] == pytest.approx(np.mean([80 / 95, 82 / 95, 78 / 95]) - 1.0)
    assert late["captured"] == pytest.approx((95.0 - 80.0) / (95.0 - 75.0))


def test_no_share_of_the_room_when_the_clairvoyant_is_not_ahead_beyond_the_seeds_spread() -> None:
    runs = {
        "rtt_aware": [run(100.0, 90.0), run(100.0, 91.0)],
        "static_best": [run(100.0, 95.0), run(100.0, 96.0)],
        "clairvoyant": [run(100.0, 90.0), run(100.0, 101.0)],  # ahead on one seed, behind on the other
    }
    late = second_half(runs)["p99_rtt_ms"]
    assert late["best_name"] == "static_best"
    assert math.isnan(late["captured"])
    assert late["best"][0] < 0


def test_the_markdown_tables_carry_the_second_half() -> None:
    runs = {
        "rtt_aware": [run(300.0, 80.0), run(310.0, 82.0)],
        "static_best": [run(90.0, 100.0), run(90.0, 104.0)],
        "clairvoyant": [run(70.0, 75.0), run(70.0, 77.0)],
    }
    late = {f: jsonable(r) for f, r in second_half(runs).items()}
    fig = {"mean": 100.0, "ci95": 1.0}
    ratio = {"kube_default": [0.1, 0.01], "best": [0.2, 0.02], "best_name": "static_best", "clairvoyant": [0.3, 0.0],
             "room": [-0.1, 0.01], "captured": None}
    doc = {"scenarios": {"large": {"policies": {p: {"mean_rtt_ms": fig, "p99_rtt_ms": fig} for p in runs},
                                   "ratios": [dict(ratio, figure="mean_rtt_ms"), dict(ratio, figure="p99_rtt_ms")],
                                   "second_half": late}},
           "speed": {"large": dict.fromkeys(runs, 100.0)}}
    text = markdown(doc)
    row = next(line for line in text.splitlines() if line.startswith("| large | 81.0 |"))
    assert "(static_best)" in row and row.endswith(f"| {(102.0 - 81.0) / (102.0 - 76.0):.0%} |")
    assert "second half" in text
