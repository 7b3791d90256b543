"""bench/bench_policies.py's parts of the runs: rtt_aware after the models' warm-up (the second half of the tasks)
and after a slowdown began, against the best baseline there."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from bench_policies import TASK_PARTS, jsonable, markdown, part_ratios

from app.sim.events import NodeEvent


def second_half(runs: dict) -> dict:
    return part_ratios(runs, TASK_PARTS["second_half"][0])


def after_slowdown(runs: dict) -> dict | None:
    return part_ratios(runs, TASK_PARTS["after_slowdown"][0])


def run(first: float, second: float, n: int = 10, slowdown_s: float | None = None) -> SimpleNamespace:
    """A run whose first half of the tasks took ``first`` ms each and whose second half ``second`` ms; one task
    submitted a second; a slowdown from ``slowdown_s`` if given."""
    rtt = np.array([first] * (n // 2) + [second] * (n - n // 2))
    events = () if slowdown_s is None else (NodeEvent("slowdown", "gpu-1", slowdown_s, factor=3.0),)
    return SimpleNamespace(apps=("a",) * n, rtt_ms=rtt, ok=np.ones(n, dtype=bool),
                           submit_s=np.arange(n, dtype=float), events=events)


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


def test_after_the_slowdown_counts_the_tasks_submitted_from_its_onset() -> None:
    # 10 tasks submitted at 0..9 s, a slowdown from 7 s: tasks 7, 8, 9 (every policy's run of a seed alike)
    def r(ms: list[float]) -> SimpleNamespace:
        out = run(0.0, 0.0, slowdown_s=7.0)
        out.rtt_ms = np.array(ms)
        return out

    runs = {
        "rtt_aware": [r([50.0] * 7 + [200.0, 220.0, 240.0]), r([50.0] * 7 + [210.0, 210.0, 210.0])],
        "static_best": [r([40.0] * 7 + [400.0] * 3), r([40.0] * 7 + [420.0] * 3)],  # best before, worst after
        "kube_default": [r([90.0] * 7 + [300.0] * 3), r([90.0] * 7 + [300.0] * 3)],
        "clairvoyant": [r([40.0] * 7 + [150.0] * 3), r([40.0] * 7 + [150.0] * 3)],
    }
    after = after_slowdown(runs)
    assert after is not None
    m = after["mean_rtt_ms"]
    assert m["best_name"] == "kube_default" and m["rtt_aware"] == pytest.approx(215.0)
    assert m["best"][0] == pytest.approx(np.mean([220.0 / 300.0, 210.0 / 300.0]) - 1.0)  # per-seed ratios
    assert m["captured"] == pytest.approx((300.0 - 215.0) / (300.0 - 150.0))


def test_no_slowdown_no_after_slowdown_part() -> None:
    runs = {"rtt_aware": [run(100.0, 90.0)], "static_best": [run(100.0, 95.0)]}
    assert after_slowdown(runs) is None
    assert second_half(runs) is not None


def test_the_markdown_tables_carry_the_part_after_the_slowdown() -> None:
    runs = {
        "rtt_aware": [run(300.0, 80.0, slowdown_s=5.0), run(310.0, 82.0, slowdown_s=5.0)],
        "static_best": [run(90.0, 100.0, slowdown_s=5.0), run(90.0, 104.0, slowdown_s=5.0)],
        "clairvoyant": [run(70.0, 75.0, slowdown_s=5.0), run(70.0, 77.0, slowdown_s=5.0)],
    }
    after = after_slowdown(runs)
    assert after is not None
    fig = {"mean": 100.0, "ci95": 1.0}
    ratio = {"kube_default": [0.1, 0.01], "best": [0.2, 0.02], "best_name": "static_best", "clairvoyant": [0.3, 0.0],
             "room": [-0.1, 0.01], "captured": None}
    doc = {"scenarios": {"degrade": {"policies": {p: {"mean_rtt_ms": fig, "p99_rtt_ms": fig} for p in runs},
                                     "ratios": [dict(ratio, figure="mean_rtt_ms"), dict(ratio, figure="p99_rtt_ms")],
                                     "after_slowdown": {f: jsonable(x) for f, x in after.items()}}},
           "speed": {"degrade": dict.fromkeys(runs, 100.0)}}
    text = markdown(doc)
    assert "after the scenario's slowdown began" in text and "second half" not in text
    assert any(line.startswith("| degrade | 81.0 |") for line in text.splitlines())
