"""The scheduling objective: a pod's own predicted RTT plus the slowdown the models say it adds to the pods
running beside it (app/scheduler/inflict.py), the same in the extender and the simulator."""

from __future__ import annotations

import pytest
from scheduler_fixtures import LinearPredictor, make_view

from app.errors import ConfigError
from app.scheduler.assumed import AssumedPods
from app.scheduler.builder import SnapshotBuilder
from app.scheduler.decide import DecideParams, decide
from app.scheduler.podinfo import PodInfo
from app.scheduler.policy import policy_from_dict

NOW = 1005.0
NODES = ["slow", "fast", "mid"]  # load 4, 1, 2 (make_view)
UPLOAD = PodInfo("up-1", "em", "uid-up", "upload", 100.0)


def params(weight: float) -> DecideParams:
    return DecideParams(policy_from_dict({"objective": {"inflicted": weight}, "exploration": {"share": 0.0}}))


def view() -> SnapshotBuilder:
    """gCTF's model: 1,000 ms more per upload pod beside it; upload's own time does not depend on its neighbours."""
    v = make_view(LinearPredictor({"load__mean": 100.0, "running_pods_upload": 1000.0, "running_pods_gCTF": 10.0},
                                  bias=50.0))
    v.set_model("upload:gpu", 1, LinearPredictor({"load__mean": 100.0}, bias=50.0))
    return v


def gctf_running_on_fast(placed_ago_s: float = 1.0, ttl_s: float = 60.0) -> AssumedPods:
    a = AssumedPods(ttl_s=ttl_s)
    a.assume("ctf-1", "gCTF", "fast", now=NOW - placed_ago_s, input_mb=512.0)
    return a


def test_the_slowdown_of_the_running_pod_is_priced_by_its_own_model() -> None:
    d = decide(view().build(now=NOW), UPLOAD, NODES, gctf_running_on_fast(), params(1.0), NOW)
    by = dict(zip(d.nodes, d.inflicted_ms, strict=True))
    # gCTF on fast: 50 + 100 + 1000 x uploads; one more upload adds 1,000 ms, 59 s of its 60 s still ahead
    assert by["fast"] == pytest.approx(1000.0 * 59.0 / 60.0)
    assert by["slow"] == by["mid"] == 0.0
    assert d.verdict(d.nodes.index("fast")).predicted_rtt_ms == pytest.approx(150.0)  # published: own time only


def test_it_moves_the_pod_off_a_node_where_it_would_slow_others_more_than_it_gains() -> None:
    own_only = decide(view().build(now=NOW), UPLOAD, NODES, gctf_running_on_fast(), params(0.0), NOW)
    assert own_only.best() == "fast" and not own_only.inflicted_ms  # 150 ms against mid's 250
    priced = decide(view().build(now=NOW), UPLOAD, NODES, gctf_running_on_fast(), params(1.0), NOW)
    assert priced.best() == "mid"  # 150 + 983 > 250
    scores = dict(priced.scores())
    assert scores["mid"] > scores["fast"]


def test_a_pod_near_its_end_costs_little_and_a_node_without_neighbours_nothing() -> None:
    late = gctf_running_on_fast(placed_ago_s=59.0)  # 1 s of its 60 s left
    d = decide(view().build(now=NOW), UPLOAD, NODES, late, params(1.0), NOW)
    assert d.inflicted_ms[d.nodes.index("fast")] == pytest.approx(1000.0 / 60.0)
    assert d.best() == "fast"
    idle = decide(view().build(now=NOW), UPLOAD, NODES, AssumedPods(), params(1.0), NOW)
    assert idle.inflicted_ms == [] and idle.best() == "fast"


def test_pods_seen_only_in_the_running_view_count_half_way_and_apps_without_a_model_not_at_all() -> None:
    v = view()
    v.apply_running("fast", {"gCTF": 2, "Motioncor2": 3}, ts=NOW - 0.5)  # no Motioncor2 model
    d = decide(v.build(now=NOW), UPLOAD, NODES, AssumedPods(), params(2.0), NOW)
    assert d.inflicted_ms[d.nodes.index("fast")] == pytest.approx(2.0 * 2 * 1000.0 * 0.5)


def test_the_weight_is_validated() -> None:
    assert policy_from_dict({}).inflicted_weight == 1.0
    with pytest.raises(ConfigError, match="policy.objective.inflicted"):
        policy_from_dict({"objective": {"inflicted": -1}})
