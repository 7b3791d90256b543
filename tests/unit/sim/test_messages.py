from __future__ import annotations

import numpy as np
import pytest

from app.contracts.codec import validate
from app.sim.apps import APPS, selection_scores, true_drivers
from app.sim.metrics import ALL_METRICS, GPU_METRICS
from app.sim.runner import SimConfig, run_offline
from app.sim.sinks import ListSink


@pytest.fixture(scope="module")
def sink():
    s = ListSink()
    run_offline(SimConfig(n_tasks=600), "kube_default", 3, sink=s)
    return s


def test_node_metrics_satisfy_the_contract(sink):
    msgs = sink.messages["node-metrics"]
    assert len(msgs) > 20
    for key, value in msgs:
        validate("node-metrics", value)
        assert key == value["node"]
        m = value["metrics"]
        assert set(m) <= set(ALL_METRICS)
        assert (value["node_class"] == "gpu") == bool(set(GPU_METRICS) & set(m))
        for name in ("cpu_usage_user", "cpu_iowait", "cpu_idle") + (("nvidia_smi_utilization_gpu",)
                                                                    if value["node_class"] == "gpu" else ()):
            assert 0.0 <= m[name] <= 1.0


def test_gpu_metrics_follow_the_load(sink):
    util = [v["metrics"]["nvidia_smi_utilization_gpu"] for _, v in sink.messages["node-metrics"]
            if v["node_class"] == "gpu"]
    assert max(util) > 0.3 and min(util) < 0.2


def test_task_completions_satisfy_the_contract(sink):
    msgs = sink.messages["task-completions"]
    assert len(msgs) == 600
    for key, value in msgs:
        validate("task-completions", value)
        assert key == value["node"]
        assert value["submitted_ts"] <= value["started_ts"] <= value["finished_ts"]
        assert value["rtt_ms"] == pytest.approx((value["finished_ts"] - value["submitted_ts"]) * 1000, abs=1e-3)


def test_true_drivers_are_emitted_metrics():
    for app in APPS:
        drivers = true_drivers(app)
        assert drivers and drivers <= set(ALL_METRICS)
    assert "cpu_iowait" in true_drivers("upload") and "nvidia_smi_utilization_gpu" in true_drivers("gCTF")
    p, r = selection_scores("gCTF", [f"{m}__mean" for m in true_drivers("gCTF")])
    assert (p, r) == (1.0, 1.0)


def test_gpu_nodes_fluctuate_more_than_cpu_nodes():
    """The same task's work varies 3-5x more (log spread) on a GPU node than on a CPU node, around its ideal
    time (mean 1)."""
    from app.sim.hardware import small_preset
    from app.sim.state import NodeRuntime

    nodes = small_preset()
    gpu = NodeRuntime(next(n for n in nodes if n.node_class == "gpu"), 2)
    cpu = NodeRuntime(next(n for n in nodes if n.node_class == "cpu"), 2)
    z = np.random.default_rng(0).standard_normal(20_000)
    upload = APPS["upload"]
    spread = {}
    for name, rt in (("gpu", gpu), ("cpu", cpu)):
        ratio = np.array([rt.work_ms(upload, 50.0, x) for x in z]) / rt.ideal_ms(upload, 50.0)
        assert abs(float(ratio.mean()) - 1.0) < 0.01
        spread[name] = float(np.log(ratio).std())
    assert 3.0 <= spread["gpu"] / spread["cpu"] <= 5.0, spread


def test_gpu_nodes_report_their_gpu_count_as_the_bridge_does():
    from app.sim.hardware import large_preset
    from app.sim.metrics import scrape
    from app.sim.state import NodeRuntime

    nodes = large_preset(20)
    counts = {}
    for spec in nodes:
        m = scrape(NodeRuntime(spec, 2), np.random.default_rng(0), now=1.0)
        counts[spec.name] = m.get("gpu_count")
        assert m.get("gpu_count") == (float(spec.gpu_count) if spec.node_class == "gpu" else None)
    assert {counts[n.name] for n in nodes if n.node_class == "gpu"} == {1.0, 2.0}
