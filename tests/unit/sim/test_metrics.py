"""The figures mean what docs/simulator.md says: GPU busy time, load spread in points, throughput, waiting."""

from __future__ import annotations

import numpy as np
import pytest

from app.sim.hardware import cpu_node, gpu_node
from app.sim.runner import SimConfig, run_offline


def test_gpu_util_is_the_fraction_of_time_a_gpu_runs_a_task():
    cfg = SimConfig(nodes=(gpu_node("g", "RTX 4090"), cpu_node("c")), n_tasks=30, rate_per_s=2.0, events="none",
                    mix={"gCTF": 1.0})
    m = run_offline(cfg, "kube_default", seed=1)
    busy = np.zeros(0)
    for s, f in sorted(zip(m.start_s, m.finish_s, strict=True)):  # union of the intervals with >= 1 task
        busy = np.append(busy, [s, f]) if not busy.size or s > busy[-1] else np.append(busy[:-1], max(f, busy[-1]))
    expected = float(np.sum(busy[1::2] - busy[::2]) / m.makespan_s)
    s = m.summary()
    assert s["gpu_util"] == pytest.approx(expected, rel=1e-9)
    assert 0.5 * expected <= s["gpu_demand"] <= 0.6 * expected  # a gCTF demands half the GPU; few overlap
    assert s["load_diff"] == pytest.approx(100.0 * expected)  # the CPU node never ran anything
    assert s["load_std"] == pytest.approx(50.0 * expected)


def test_load_diff_is_max_minus_min_in_points_over_joined_nodes():
    m = run_offline(SimConfig(n_tasks=800), "round_robin", seed=2)
    util = m.node_util[np.isfinite(m.node_util)]
    assert len(util) == len(m.node_names)  # the joining node counts from its join
    assert m.summary()["load_diff"] == pytest.approx(100.0 * (util.max() - util.min()))
    assert np.all((0.0 <= util) & (util <= 1.0))


def test_queueing_delay_and_throughput_of_an_open_loop():
    m = run_offline(SimConfig(n_tasks=600, load=1.5, events="none"), "kube_default", seed=4)
    s = m.summary()
    wait = (m.start_s - m.submit_s) * 1000.0
    assert s["queue_ms"] == pytest.approx(wait.mean()) and s["queue_ms"] > 0
    assert s["throughput"] == pytest.approx(600 / (m.finish_s.max() - m.submit_s.min()))
    assert s["mean_rtt_ms"] == pytest.approx(m.rtt_ms.mean())
    assert s["rtt_std_ms"] == pytest.approx(m.rtt_ms.std())
