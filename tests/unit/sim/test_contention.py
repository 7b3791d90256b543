"""Contention acts on running tasks: processor sharing re-rates them on every start, end and event."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from app.sim import apps
from app.sim.apps import APPS
from app.sim.events import EventSpec
from app.sim.hardware import cpu_node, gpu_node, small_preset
from app.sim.runner import SimConfig, run_offline
from app.sim.state import NodeRuntime


def test_processor_sharing_conserves_work():
    cfg = SimConfig(n_tasks=2000, load=0.9)  # default events: throttle, neighbour, slowdown, a join
    m = run_offline(cfg, "random", seed=3)
    ok = m.ok
    assert ok.sum() == 2000
    np.testing.assert_allclose(m.served_ms[ok], m.work_ms[ok], rtol=1e-9, atol=1e-6)
    assert np.all((m.finish_s[ok] - m.start_s[ok]) * 1000.0 >= m.work_ms[ok] * (1 - 1e-9))


def test_a_start_slows_the_neighbours_and_an_end_speeds_them_up():
    rt = NodeRuntime(gpu_node("g", "RTX 4090"), 0)
    a = rt.start(0, APPS["Motioncor2"], 150.0, work_ms=100.0, now=0.0)
    alone = a.finish_s
    b = rt.start(1, APPS["Motioncor2"], 150.0, work_ms=100.0, now=0.02)
    slowed = a.finish_s
    assert slowed > alone
    rt.end(b, 0.03)  # b leaves early (e.g. taken off): a speeds up again
    assert alone < a.finish_s < slowed
    rt.end(a, a.finish_s)
    assert a.served_ms == pytest.approx(100.0)


def test_interfering_apps_slow_each_other_beyond_their_demand(monkeypatch):
    def factor_next_to(other: str) -> float:
        rt = NodeRuntime(gpu_node("g", "RTX 4090"), 0)
        rt.start(0, APPS[other], 150.0, work_ms=100.0, now=0.0)
        run = rt.start(1, APPS["gCTF"], 80.0, work_ms=100.0, now=0.0)
        return run.factor

    with_pair = factor_next_to("Motioncor2")
    monkeypatch.setattr(apps, "INTERFERENCE", {})
    assert with_pair == pytest.approx(factor_next_to("Motioncor2") + 0.25)


def test_an_event_re_rates_the_running_tasks():
    node = gpu_node("g", "RTX 4090")
    slow = EventSpec("slowdown", "g", at=0.5, factor=3.0)
    base = SimConfig(nodes=(node,), n_tasks=40, rate_per_s=20.0, events="none", mix={"gCTF": 1.0})
    m0 = run_offline(base, "kube_default", seed=1)
    m1 = run_offline(dataclasses.replace(base, events=(slow,)), "kube_default", seed=1)
    running_at_event = np.flatnonzero((m0.start_s < 0.5) & (m0.finish_s > 0.5))
    before = np.flatnonzero(m0.finish_s <= 0.5)
    assert len(running_at_event) and len(before)
    np.testing.assert_array_equal(m0.finish_s[before], m1.finish_s[before])
    assert np.all(m1.finish_s[running_at_event] > m0.finish_s[running_at_event])
    np.testing.assert_allclose(m1.served_ms[m1.ok], m1.work_ms[m1.ok], rtol=1e-9)


def test_a_uniformly_faster_cluster_raises_closed_loop_throughput():
    slow = (gpu_node("g1", "Tesla M40"), gpu_node("g2", "Tesla M40"), cpu_node("c1"), cpu_node("c2"))
    fast = tuple(dataclasses.replace(n, disk_mb_s=n.disk_mb_s * 2) if n.gpu is None else
                 gpu_node(n.name, "RTX 4090", cores=n.cpu_cores, mem_gb=n.mem_gb, disk_mb_s=n.disk_mb_s * 2)
                 for n in slow)
    cfg = SimConfig(nodes=slow, arrivals="closed", clients=12, think_s=0.05, duration_s=60.0, events="none")
    thr = {name: run_offline(dataclasses.replace(cfg, nodes=nodes), "kube_default", seed=2).summary()["throughput"]
           for name, nodes in (("slow", slow), ("fast", fast))}
    assert thr["fast"] > 1.5 * thr["slow"], thr


def test_capacity_estimate_tracks_the_cluster():
    from app.sim.capacity import capacity_per_s

    small = small_preset()
    assert capacity_per_s(small + [gpu_node("extra", "RTX 4090")]) > capacity_per_s(small) > 0
    with pytest.raises(ValueError, match="no node can run"):
        capacity_per_s([cpu_node("c")], {"gCTF": 1.0})
