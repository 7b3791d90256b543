"""static_best (calibrated table) and the clairvoyant reference."""

from __future__ import annotations

import numpy as np
import pytest

from app.sim.apps import APPS, ideal_ms
from app.sim.hardware import gpu_node, small_preset
from app.sim.policies.calibration import fit, hardware_class, measure
from app.sim.policies.clairvoyant import Clairvoyant
from app.sim.policies.static_best import StaticBest
from app.sim.state import NodeRuntime
from app.sim.view import ClusterView, Task


def _view(nodes):
    rts = {n.name: NodeRuntime(n, i) for i, n in enumerate(nodes)}
    return rts, ClusterView(rts, lambda: 0.0, 0.0)


def test_calibration_recovers_idle_times_and_a_contention_factor():
    node = small_preset()[2]
    table, k = fit({hardware_class(node): measure(node)})
    for app, mb in (("gCTF", 80.0), ("Motioncor2", 150.0), ("upload", 40.0)):
        a, b = table[(hardware_class(node), app)]
        assert a + b * mb == pytest.approx(ideal_ms(APPS[app], node, mb), rel=0.05)
    assert 0.2 < k < 1.5
    assert measure(node) is measure(gpu_node("other-name", "RTX 4090", cores=16, mem_gb=64.0, disk_mb_s=1500.0))


def test_static_best_prefers_the_fast_node_until_it_is_busy():
    nodes = small_preset()[:3]  # K20c, M40, RTX 4090
    rts, view = _view(nodes)
    pol = StaticBest(np.random.default_rng(0))
    task = Task(0, "gCTF", 80.0, 0.0, 0.0)
    assert pol.choose(task, nodes, view).name == "worker-3"
    for i in range(3):
        rts["worker-3"].start(100 + i, APPS["gCTF"], 80.0, 30.0, 0.0)
    expected = min(nodes, key=lambda n: pol.predict_ms(task, n, view.running(n.name)))
    assert pol.choose(task, nodes, view).name == expected.name
    assert pol.predict_ms(task, nodes[2], 3) == pytest.approx(pol.predict_ms(task, nodes[2], 0) * (1 + 3 * pol.k))


def test_static_best_calibrates_a_class_that_joins_later():
    nodes = small_preset()[:2]
    _, view = _view(nodes)
    pol = StaticBest(np.random.default_rng(0))
    pol.choose(Task(0, "gCTF", 80.0, 0.0, 0.0), nodes, view)
    assert pol.trace.notes["static_best"]["classes"] == 2
    new = gpu_node("late", "Tesla M40 24GB", cores=12, disk_mb_s=450.0)
    rts, view = _view([*nodes, new])
    pol.choose(Task(1, "gCTF", 80.0, 0.0, 0.0), [*nodes, new], view)
    assert pol.trace.notes["static_best"]["classes"] == 3


def test_clairvoyant_counts_what_a_placement_costs_its_neighbours():
    a, b = gpu_node("a", "RTX 4090"), gpu_node("b", "RTX 4090")
    rts, view = _view([a, b])
    for i in range(2):
        rts["a"].start(i, APPS["Motioncor2"], 300.0, 400.0, 0.0)
    task = Task(9, "gCTF", 80.0, 0.0, 0.0)
    own_a, hurt_a = view.clairvoyant_cost(task, "a")
    own_b, hurt_b = view.clairvoyant_cost(task, "b")
    assert own_a > own_b and hurt_a > 0 == hurt_b
    assert Clairvoyant().choose(task, [a, b], view).name == "b"
    before = [(r.factor, r.finish_s) for r in rts["a"].running.values()]
    view.clairvoyant_cost(task, "a")  # probing leaves the node as it was
    assert [(r.factor, r.finish_s) for r in rts["a"].running.values()] == before
    assert rts["a"].node_demand == pytest.approx([0.8, 1.2, 0.4, 0.0, 4.0])
