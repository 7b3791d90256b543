"""decide() gathers the running pods of its busy candidates column by column and shares one features map among
candidates with the same counts: the same features, model rows and penalties as the node-by-node definition."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_fixtures import LinearPredictor, make_view

from app.scheduler.assumed import AssumedPods
from app.scheduler.decide import DecideParams, _placed, decide, known_apps, running_features
from app.scheduler.filtering import contention_factor
from app.scheduler.podinfo import PodInfo
from app.scheduler.policy import policy_from_dict

NOW = 1005.0
NODES = ["slow", "fast", "mid"]
APPS = ["gCTF", "upload", "Motioncor2"]
PARAMS = DecideParams(policy_from_dict({"exploration": {"share": 0.0}}))
GCTF = LinearPredictor({"load__mean": 100.0, "running_pods_upload": 1000.0, "running_pods_gCTF": 10.0,
                        "running_pods_Motioncor2": 3.3, "task_input_size_mb": 0.1}, bias=50.0)

pods_st = st.lists(st.tuples(st.sampled_from(APPS), st.sampled_from(NODES), st.floats(0.5, 70.0),
                             st.sampled_from([None, 2.0, 30.0])), max_size=10)
views_st = st.dictionaries(st.sampled_from(NODES), st.tuples(
    st.dictionaries(st.sampled_from(APPS), st.integers(0, 2)), st.sampled_from([0.0, NOW - 30.0, NOW - 2.0])))


@settings(max_examples=150, deadline=None)
@given(pods=pods_st, running=views_st, app=st.sampled_from(APPS))
def test_features_and_penalties_are_the_node_by_node_ones(
    pods: list[tuple[str, str, float, float | None]], running: dict[str, tuple[dict[str, int], float]], app: str,
) -> None:
    v = make_view(GCTF)
    for node, (apps, ts) in running.items():
        v.apply_running(node, apps, ts=ts)
    assumed = AssumedPods(ttl_s=60.0, scrape_delay_s=5.0)
    for k, (a, node, ago, expected_s) in enumerate(pods):
        assumed.assume(f"p{k}", a, node, now=NOW - ago, expected_s=expected_s)
    snap = v.build(now=NOW)
    pod = PodInfo("new", "em", "uid-new", app, 250.0)
    d = decide(snap, pod, NODES, assumed, PARAMS, NOW, note_expected=False)
    apps = known_apps(snap, assumed, app)
    idle = running_features(apps, {}, {})
    for i, name in enumerate(NODES):  # the definition, one node at a time
        st_ = snap.nodes[name]
        since = st_.running_ts - PARAMS.policy.scrape_delay_s if st_.running_ts > 0 else -math.inf
        counts = assumed.counts(name, NOW, exclude=pod.task_id, since=since)
        want = running_features(apps, st_.running, counts) if st_.running or counts else idle
        assert dict(d.features[i]) == want
        pending = tuple(p.app for p in assumed.pending(name, st_.features_ts, NOW, exclude=pod.task_id))
        factor = contention_factor(app, pending, PARAMS.policy) if pending else 1.0
        if app == "gCTF":  # the only app with a model: its rows see the features above
            load = {"fast": 1.0, "mid": 2.0, "slow": 4.0}[name]
            row = [load, *(want.get(f"running_pods_{a}", math.nan) for a in ("upload", "gCTF", "Motioncor2")), 250.0]
            model_ms = float(GCTF.predict(np.array([row], dtype=np.float32))[0])
            assert d.model_rtt_ms[i] == model_ms
            assert d.rtt_ms[i] == model_ms * factor


@given(st.lists(st.sampled_from([f"n{i}" for i in range(8)]), max_size=10),
       st.sets(st.sampled_from([f"n{i}" for i in range(12)])))
def test_the_placed_candidates_are_those_with_a_placement(nodes: list[str], by_node: set[str]) -> None:
    index = {name: i for i, name in reversed(list(enumerate(nodes)))}
    got = _placed(dict.fromkeys(by_node).keys(), nodes, lambda: index)
    assert got.tolist() == [name in by_node for name in nodes]
