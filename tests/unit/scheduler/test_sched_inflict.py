"""The scheduling objective: a pod's own predicted RTT plus the slowdown the models say it adds to the pods
running beside it (app/scheduler/inflict.py), the same in the extender and the simulator."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_fixtures import LinearPredictor, make_view

from app.errors import ConfigError
from app.features.vector import RUNNING_PREFIX
from app.scheduler.assumed import AssumedPod, AssumedPods
from app.scheduler.builder import SnapshotBuilder
from app.scheduler.decide import DecideParams, decide
from app.scheduler.podinfo import PodInfo
from app.scheduler.policy import policy_from_dict
from app.scheduler.snapshot import Snapshot

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


def reference_inflicted(snapshot: Snapshot, app: str, nodes: Sequence[str], features: Sequence[Mapping[str, float]],
                        assumed: AssumedPods, now: float, task_id: str, weight: float) -> np.ndarray:
    """The module docstring's sum, one candidate, running app and pod at a time, each pair predicted alone, the
    terms added in the order inflicted_ms adds them (its groups: (app, model) in order of first use)."""
    table = snapshot.table
    terms: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for i, counts in enumerate(features):
        pods: dict[str, list[AssumedPod]] = {}
        for p in reversed(assumed.on_node(nodes[i], now, exclude=task_id)):
            pods.setdefault(p.app, []).append(p)
        for name, c in counts.items():
            b = name[len(RUNNING_PREFIX):]
            routes = snapshot.app_routes(b)
            if c <= 0 or routes is None or routes.model[table.pos[nodes[i]]] < 0:
                continue
            at = table.pos[nodes[i]]
            m = int(routes.model[at])
            entry = routes.entries[m]
            known = [(p.input_mb, p.remaining(now)) for p in pods.get(b, [])][:int(c)]
            for mb, left in known + [(math.nan, 0.5)] * (int(c) - len(known)):
                x = entry.matrix[[routes.row[at]] * 2]
                for j, f in enumerate(entry.feature_names):
                    if f == "task_input_size_mb":
                        x[:, j] = mb
                    elif f.startswith(RUNNING_PREFIX):
                        x[:, j] = counts.get(f, 0.0) - (1.0 if f == name else 0.0)
                        x[1, j] += 1.0 if f == RUNNING_PREFIX + app else 0.0
                without, with_ = np.asarray(entry.predictor.predict(x), dtype=np.float64)
                delta = max(0.0, with_ - without) if math.isfinite(with_ - without) else 0.0
                terms.setdefault((b, m), []).append((i, weight * delta * (float(routes.correction[at]) * left)))
    out = np.zeros(len(nodes))
    for group in terms.values():
        for i, term in group:
            out[i] += term
    return out


pods_st = st.lists(st.tuples(st.sampled_from(["gCTF", "upload"]), st.sampled_from(NODES), st.floats(0.5, 50.0),
                             st.sampled_from([None, 2.0, 30.0]), st.sampled_from([math.nan, 100.0, 733.3])),
                   max_size=8)
views_st = st.dictionaries(st.sampled_from(NODES), st.dictionaries(st.sampled_from(["gCTF", "upload"]),
                                                                    st.integers(0, 3)))


@settings(max_examples=150, deadline=None)
@given(pods=pods_st, running=views_st, own_model=st.booleans(), app=st.sampled_from(["gCTF", "upload"]),
       weight=st.sampled_from([0.5, 1.0, 3.0]))
def test_the_batched_sum_is_bit_for_bit_the_one_pod_at_a_time_sum(
    pods: list[tuple[str, str, float, float | None, float]], running: dict[str, dict[str, int]], own_model: bool,
    app: str, weight: float,
) -> None:
    """inflicted_ms lays its rows out with array operations: the same numbers, to the bit, as the definition."""
    v = make_view(LinearPredictor({"load__mean": 100.0, "running_pods_upload": 1000.0, "running_pods_gCTF": 10.0,
                                   "task_input_size_mb": 0.37}, bias=50.0))
    v.set_model("upload:gpu", 1, LinearPredictor({"load__mean": 100.0, "running_pods_gCTF": 333.3,
                                                  "running_pods_upload": 7.1}, bias=50.0))
    if own_model:  # a second model, and so a second group, for gCTF on mid
        v.set_model("gCTF:gpu:mid", 2, LinearPredictor({"load__mean": 3.0, "running_pods_upload": 77.7,
                                                        "task_input_size_mb": 1.1}, bias=5.0))
    for node, apps in running.items():
        v.apply_running(node, apps, ts=NOW - 30.0)
    assumed = AssumedPods(ttl_s=60.0)
    for k, (a, node, ago, expected_s, mb) in enumerate(pods):
        assumed.assume(f"p{k}", a, node, now=NOW - ago, expected_s=expected_s, input_mb=mb)
    snap = v.build(now=NOW)
    pod = PodInfo("new", "em", "uid-new", app, 250.0)
    d = decide(snap, pod, NODES, assumed, params(weight), NOW)
    expected = reference_inflicted(snap, app, NODES, d.features, assumed, NOW, pod.task_id, weight)
    got = np.array(d.inflicted_ms) if d.inflicted_ms else np.zeros(len(NODES))
    assert got.tolist() == expected.tolist()


WARM_THEN_PRICE = """
import sys
sys.path.insert(0, sys.argv[1])
from test_sched_inflict import NODES, NOW, UPLOAD, gctf_running_on_fast, params, view
from app.scheduler import inflict
from app.scheduler.decide import decide

kernels = (inflict._layout, inflict._group_rows, inflict._add_terms)
inflict.warm_kernels()
warmed = [list(k.signatures) for k in kernels]
d = decide(view().build(now=NOW), UPLOAD, NODES, gctf_running_on_fast(), params(1.0), NOW)
assert max(d.inflicted_ms) > 0, d.inflicted_ms
print([len(w) for w in warmed], [list(k.signatures) == w for k, w in zip(kernels, warmed)])
"""


def test_warming_the_kernels_compiles_what_a_request_then_uses() -> None:
    """The extender warms the slowdown pricing's compiled steps when it opens the registry: a fresh process that
    warms them and then prices a slowdown compiles nothing more (one signature each, the request's)."""
    import subprocess
    import sys
    from pathlib import Path

    here = str(Path(__file__).parent)
    out = subprocess.run([sys.executable, "-c", WARM_THEN_PRICE, here], capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "[1, 1, 1] [True, True, True]"
