"""Running-pods task features in decide(): per candidate, into model rows by name, with the verdicts."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_fixtures import LinearPredictor, features_msg, make_linear, make_view

from app.scheduler.assumed import AssumedPods
from app.scheduler.builder import SnapshotBuilder, node_features_map
from app.scheduler.decide import DecideParams, decide, running_features
from app.scheduler.podinfo import PodInfo
from app.scheduler.policy import policy_from_dict

NOW = 1005.0
GCTF = PodInfo("ctf-1", "em", "uid-1", "gCTF", 512.0)
NODES = ["slow", "fast", "mid"]
PARAMS = DecideParams(policy_from_dict({}), credibility_prior=0.5, stale_after_s=30.0)


def run(view: SnapshotBuilder, assumed: AssumedPods, now: float = NOW, pod: PodInfo = GCTF):
    return decide(view.build(now=now), pod, NODES, assumed, PARAMS, now)


def crowded_view() -> tuple[SnapshotBuilder, LinearPredictor]:
    """``make_view`` plus a gCTF model that charges 1,000 ms per running gCTF pod."""
    model = LinearPredictor({"load__mean": 100.0, "running_pods_gCTF": 1000.0}, bias=50.0)
    view = make_view(make_linear())
    view.set_model("gCTF:gpu", 4, model)
    return view, model


def test_running_pods_enter_rows_of_models_that_name_them() -> None:
    view, _ = crowded_view()
    assumed = AssumedPods(ttl_s=60)
    assumed.assume("p1", "gCTF", "fast", now=NOW - 1)
    assumed.assume("p2", "gCTF", "fast", now=NOW - 1)
    view.apply_running("mid", {"gCTF": 1})
    d = run(view, assumed)
    by = {v.node: v for v in d.verdicts}
    assert by["fast"].predicted_rtt_ms == pytest.approx(50 + 100 + 2000)
    assert by["mid"].predicted_rtt_ms == pytest.approx(50 + 200 + 1000)
    assert by["slow"].predicted_rtt_ms == pytest.approx(50 + 400)
    assert d.best() == "slow"  # the idle node wins once the model sees what runs beside the task
    assert by["fast"].features == {"running_pods_gCTF": 2.0}
    assert by["slow"].features == {"running_pods_gCTF": 0.0}


def test_models_without_the_columns_are_unaffected() -> None:
    view = make_view(make_linear())
    empty = run(view, AssumedPods()).verdicts
    assumed = AssumedPods(ttl_s=60)
    assumed.assume("p1", "gCTF", "fast", now=NOW - 1)
    busy = run(view, assumed).verdicts
    assert [v.predicted_rtt_ms for v in busy] == [v.predicted_rtt_ms for v in empty]
    assert {v.node: v.features["running_pods_gCTF"] for v in busy} == {"slow": 0.0, "fast": 1.0, "mid": 0.0}


def test_every_known_app_gets_a_column_and_the_pod_itself_does_not_count() -> None:
    view, _ = crowded_view()
    view.set_model("upload:cpu", 1, make_linear())
    assumed = AssumedPods(ttl_s=60)
    assumed.assume("m1", "Motioncor2", "mid", now=NOW - 1)
    assumed.assume("uid-1", "gCTF", "mid", now=NOW - 1)  # the pod being scored, assumed earlier
    by = {v.node: v for v in run(view, assumed).verdicts}
    assert by["mid"].features == {"running_pods_Motioncor2": 1.0, "running_pods_gCTF": 0.0,
                                  "running_pods_upload": 0.0}


def test_stale_nodes_get_no_features() -> None:
    view, _ = crowded_view()
    view.apply_node_features(features_msg("old", 900.0, 1.0))
    d = decide(view.build(now=NOW), GCTF, NODES + ["old"], AssumedPods(), PARAMS, NOW)
    by = {v.node: v for v in d.verdicts}
    assert by["old"].features == {} and math.isnan(by["old"].predicted_rtt_ms)


def test_placements_stop_counting_after_a_multiple_of_their_predicted_rtt() -> None:
    view, _ = crowded_view()
    assumed = AssumedPods(ttl_s=60, rtt_multiple=2.0)
    d = run(view, assumed, pod=PodInfo("ctf-9", "em", "uid-9", "gCTF", 1.0))
    best = d.best()
    assert best == "fast"
    expected_s = d.rtt_ms[NODES.index(best)] / 1000.0  # 150 ms
    assumed.assume("uid-9", "gCTF", best, now=NOW)
    assert assumed.counts(best, now=NOW + 1.9 * expected_s) == {"gCTF": 1}
    assert assumed.counts(best, now=NOW + 2.1 * expected_s) == {}


def test_hw_cpu_cores_comes_from_the_cpu_count_gauge() -> None:
    with_count = node_features_map(features_msg("c", 1.0, 0.0, node_class="cpu", cpu_count__last=32.0))
    without = node_features_map(features_msg("c", 1.0, 0.0, node_class="cpu"))
    assert with_count["hw_cpu_cores"] == 32.0 and "hw_cpu_cores" not in without
    stale = features_msg("c", 1.0, 0.0, node_class="cpu", cpu_count__last=32.0)
    stale["stale"] = ["cpu_count"]
    assert "hw_cpu_cores" not in node_features_map(stale)


@settings(max_examples=60, deadline=None)
@given(running=st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 50)),
       placed=st.dictionaries(st.sampled_from(["a", "b", "d"]), st.integers(0, 50)))
def test_running_features_are_the_larger_count_per_app(running: dict[str, int], placed: dict[str, int]) -> None:
    apps = ("a", "b", "c", "d")
    f = running_features(apps, running, placed)
    assert set(f) == {f"running_pods_{a}" for a in apps}
    for a in apps:
        assert f[f"running_pods_{a}"] == max(running.get(a, 0), placed.get(a, 0))


def test_hw_gpu_count_comes_from_the_gpu_count_gauge() -> None:
    two = node_features_map(features_msg("g", 1.0, 0.0, gpu_count__last=2.0, cpu_count__last=16.0))
    assert two["hw_gpu_count"] == 2.0 and two["hw_cpu_cores"] == 16.0
    assert "hw_gpu_count" not in node_features_map(features_msg("g", 1.0, 0.0))  # no gauge: missing
    assert "hw_gpu_count" not in node_features_map(features_msg("c", 1.0, 0.0, node_class="cpu", gpu_count__last=2.0))
    stale = features_msg("g", 1.0, 0.0, gpu_count__last=2.0)
    stale["stale"] = ["gpu_count"]  # the GPU exporter is down: its gauge is not read
    assert "hw_gpu_count" not in node_features_map(stale)


def test_a_node_known_only_from_the_running_view_goes_when_nothing_runs_there() -> None:
    """A node's tombstone while its pods still run, then the pods end: nothing of it is left (else every
    node that ever left that way stayed in every snapshot)."""
    b = SnapshotBuilder()
    for i in range(50):
        node = f"gone-{i}"
        b.apply_node_features({"node": node, "ts": NOW, "node_class": "gpu", "gpu_model": "Tesla M40",
                               "window_s": 30.0, "count": 30, "features": {"load__mean": 1.0}})
        b.apply_running(node, {"gCTF": 2}, NOW)
        b.remove_node(node)  # the worker's tombstone
        b.apply_running(node, {"gCTF": 2}, NOW + 1)  # the pods are still listed
        assert b.node_count == 1
        b.apply_running(node, {}, NOW + 2)  # and then gone
        assert b.node_count == 0
    b.apply_running("never-scraped", {}, NOW)
    assert b.node_count == 0
    b.apply_node_features({"node": "kept", "ts": NOW, "node_class": "cpu", "gpu_model": None, "window_s": 30.0,
                           "count": 30, "features": {"load__mean": 1.0}})
    b.apply_running("kept", {}, NOW)  # a scraped node stays with nothing running
    assert b.node_count == 1 and "kept" in b.build(NOW).nodes
