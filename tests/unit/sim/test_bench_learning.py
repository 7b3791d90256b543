"""bench/bench_learning.py: variants on a scenario's run, and the DWA windows it reports."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from bench_learning import RMSE_APPS, VARIANTS, factory

from app.sim.runner import SimConfig, run_offline


def test_the_windows_recorded_are_dwa_s_within_its_bounds_and_a_fixed_window_s_otherwise() -> None:
    config = SimConfig(n_tasks=1200, load=0.5)
    moving: list[tuple[str, float]] = []
    pinned: list[tuple[str, float]] = []
    m = run_offline(config, factory({}, moving), 1)
    run_offline(config, factory(VARIANTS["fixed 5 s window"], pinned), 1)
    gpu_apps = sum(1 for a, c in zip(m.apps, m.task_node_class(), strict=True) if a in RMSE_APPS and c == "gpu")
    assert 0 < len(moving) <= gpu_apps  # one per GPU placement of gCTF or Motioncor2 once its node is tracked
    assert {a for a, _ in moving} == set(RMSE_APPS)
    windows = np.array([w for _, w in moving])
    assert windows.min() >= 5.0 and windows.max() <= 60.0 and len(set(windows.tolist())) > 1  # DWA moved them
    assert pinned and {w for _, w in pinned} == {5.0}


def test_an_unknown_scenario_is_named_with_the_ones_there_are(bench_error: Callable[[str, list[str]], str]) -> None:
    err = bench_error("bench_learning", ["--scenario", "nope", "--no-speed"])
    assert "--scenario: no such scenario 'nope'" in err and "pulsing" in err and "default" in err
