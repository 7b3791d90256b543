"""Filter / prioritize over a snapshot: batching, model choice, staleness, anti-affinity, SLA, contention."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scheduler_fixtures import LinearPredictor, features_msg, make_linear, make_view, weights_msg

from app.scheduler.assumed import AssumedPods
from app.scheduler.builder import SnapshotBuilder
from app.scheduler.decide import NO_APP, NOT_READY, STALE_NODES, STALE_SNAPSHOT, DecideParams, decide
from app.scheduler.podinfo import PodInfo
from app.scheduler.policy import policy_from_dict

NOW = 1005.0
GCTF = PodInfo("ctf-1", "em", "uid-1", "gCTF", 512.0)
MC2 = PodInfo("mc-1", "em", "uid-2", "Motioncor2", math.nan)
NODES = ["slow", "fast", "mid"]


@pytest.fixture
def linear() -> LinearPredictor:
    return make_linear()


@pytest.fixture
def view(linear: LinearPredictor) -> SnapshotBuilder:
    return make_view(linear)


def run(view: SnapshotBuilder, pod: PodInfo = GCTF, nodes: list[str] = NODES, assumed: AssumedPods | None = None,
        now: float = NOW, **policy: object):
    policy.setdefault("exploration", {"share": 0.0})  # scoring alone (exploration: test_sched_learning.py)
    params = DecideParams(policy_from_dict(policy), credibility_prior=0.5, stale_after_s=30.0)
    return decide(view.build(now=now), pod, nodes, assumed or AssumedPods(), params, now)


def test_ranks_by_predicted_rtt_with_one_predict_call_per_model(view: SnapshotBuilder,
                                                                linear: LinearPredictor) -> None:
    d = run(view)
    assert d.neutral is None and d.failed_nodes() == {}
    assert d.scores() == [("slow", 4), ("fast", 10), ("mid", 7)]
    by = {v.node: v for v in d.verdicts}
    assert by["fast"].predicted_rtt_ms == pytest.approx(50 + 100 + 51.2)
    assert (by["fast"].model_key, by["fast"].model_version) == ("gCTF:gpu", 3)
    assert linear.calls == [3]
    assert d.best() == "fast" and d.passed() == NODES


def test_own_model_preferred_and_weights_prediction_as_fallback(view: SnapshotBuilder) -> None:
    own = LinearPredictor({"load__mean": 1.0})
    view.set_model("gCTF:gpu:slow", 1, own)
    view.apply_node_features(features_msg("cpu-1", 1000.0, 1.0, node_class="cpu"))
    view.apply_node_weights(weights_msg("cpu-1", 1000.0, 1.0, gCTF=100.0))
    by = {v.node: v for v in run(view, nodes=NODES + ["cpu-1"]).verdicts}
    assert by["slow"].model_key == "gCTF:gpu:slow" and by["slow"].predicted_rtt_ms == 4.0 and own.calls == [1]
    assert by["cpu-1"].predicted_rtt_ms == 100.0 and by["cpu-1"].model_key is None
    assert by["slow"].score == 10


@pytest.mark.parametrize(("pod", "snapshot", "now", "reason"), [
    (PodInfo("web", "default", "", None, math.nan), True, NOW, NO_APP),
    (GCTF, False, NOW, NOT_READY),
    (GCTF, True, 1000.0 + 31.0, STALE_SNAPSHOT),
])
def test_neutral_answers(view: SnapshotBuilder, pod: PodInfo, snapshot: bool, now: float, reason: str) -> None:
    params = DecideParams(policy_from_dict({"sla_ms": {"gCTF": 1.0}}), stale_after_s=30.0)
    d = decide(view.build(now=now) if snapshot else None, pod, NODES, AssumedPods(), params, now)
    assert d.neutral == reason and d.stale == (reason != NO_APP)
    assert [v.stale for v in d.verdicts] == [reason != NO_APP] * len(NODES)
    assert d.scores() == [(n, 5) for n in NODES] and d.failed_nodes() == {} and d.best() is None


def test_every_candidate_stale_or_unknown_is_neutral_never_filtered(view: SnapshotBuilder) -> None:
    view.apply_node_weights(weights_msg("fast", 1001.0, 1.0, stale=True))
    view.apply_node_features(features_msg("fresh-elsewhere", NOW, 1.0))
    d = run(view, nodes=["fast", "unknown-node"], sla_ms={"gCTF": 1.0})
    assert d.neutral == STALE_NODES and d.failed_nodes() == {}


def test_a_stale_node_among_fresh_ones_passes_with_the_neutral_score(view: SnapshotBuilder) -> None:
    view.apply_node_weights(weights_msg("slow", 1001.0, 1.0, stale=True))
    d = run(view, sla_ms={"gCTF": 250.0}, sla_when_all_fail="fail")
    by = {v.node: v for v in d.verdicts}
    assert by["slow"].stale and by["slow"].score == 5 and by["slow"].failed is None
    assert "mid" in d.failed_nodes() and "fast" not in d.failed_nodes()


def test_a_node_whose_metric_group_is_stale_passes_with_the_neutral_score(view: SnapshotBuilder) -> None:
    """A hung GPU's zeros are withheld (its group marked stale in node-features): the node is scored neutral,
    as a stale node, not predicted from what is left of its row (it looked fast: an idle GPU)."""
    hung = features_msg("slow", 1002.0, 0.0)
    hung["stale"] = ["gpu"]
    view.apply_node_features(hung)
    d = run(view)
    by = {v.node: v for v in d.verdicts}
    assert by["slow"].stale and by["slow"].score == 5 and by["slow"].failed is None
    assert math.isnan(by["slow"].predicted_rtt_ms) and d.best() == "fast"
    back = features_msg("slow", 1003.0, 0.0)  # good scrapes return: scored again (and fastest now)
    view.apply_node_features(back)
    assert not {v.node: v for v in run(view).verdicts}["slow"].stale and run(view).best() == "slow"


def test_sla_filter_with_reason(view: SnapshotBuilder) -> None:
    d = run(view, sla_ms={"gCTF": 350.0})
    assert d.failed_nodes() == {"slow": "predicted RTT 501 ms exceeds the SLA of gCTF (350 ms)"}
    assert d.passed() == ["fast", "mid"] and not d.sla_relaxed


def test_sla_failing_everywhere_passes_all_unless_strict(view: SnapshotBuilder) -> None:
    relaxed = run(view, sla_ms={"gCTF": 100.0})
    assert relaxed.sla_relaxed and relaxed.failed_nodes() == {} and relaxed.best() == "fast"
    strict = run(view, sla_ms={"gCTF": 100.0}, sla_when_all_fail="fail")
    assert set(strict.failed_nodes()) == set(NODES)


def test_anti_affinity_from_running_apps_and_assumed_pods(view: SnapshotBuilder) -> None:
    view.apply_running("fast", {"Motioncor2": 1})
    assumed = AssumedPods()
    assumed.assume("other-mc", "Motioncor2", "mid", now=NOW - 1)
    assumed.assume("uid-2", "Motioncor2", "slow", now=NOW - 1)  # the pod itself: does not count
    d = run(view, pod=MC2, assumed=assumed, anti_affinity=[["Motioncor2", "Motioncor2"]])
    assert d.failed_nodes() == {
        "fast": "anti-affinity: Motioncor2 interferes with Motioncor2 already running on this node",
        "mid": "anti-affinity: Motioncor2 interferes with Motioncor2 just placed on this node",
    }
    assert run(view, pod=GCTF, assumed=assumed, anti_affinity=[["Motioncor2", "Motioncor2"]]).failed_nodes() == {}


def test_contention_penalty_until_metrics_show_the_pod(view: SnapshotBuilder) -> None:
    assumed = AssumedPods(ttl_s=120, scrape_delay_s=5)
    for i in range(3):
        assumed.assume(f"p{i}", "gCTF", "fast", now=NOW - 1)
    d = run(view, assumed=assumed, anti_affinity=[["gCTF", "gCTF"]], contention={"interfering": 0.5},
            sla_when_all_fail="pass")
    assert d.failed_nodes() and "fast" in d.failed_nodes()  # anti-affinity applies to gCTF pairs
    d = run(view, assumed=assumed, contention={"other": 0.5})
    by = {v.node: v for v in d.verdicts}
    assert by["fast"].predicted_rtt_ms == pytest.approx(201.2)  # published: the model's own prediction
    fast = d.nodes.index("fast")
    assert d.rtt_ms[fast] == pytest.approx(201.2 * (1 + 3 * 0.5))  # scored: additive penalty per pending pod
    assert d.best() == "mid"
    view.apply_node_features(features_msg("fast", NOW + 5, 1.0))  # metrics now include the placements
    d = run(view, assumed=assumed, now=NOW + 6, contention={"other": 0.5})
    assert d.best() == "fast"


def test_credibility_pulls_toward_neutral_and_prior_for_unevaluated(view: SnapshotBuilder) -> None:
    view.apply_node_weights(weights_msg("fast", 1001.0, 0.0))
    view.apply_node_features(features_msg("new", 1000.0, 1.0))
    by = {v.node: v for v in run(view, nodes=NODES + ["new"]).verdicts}
    assert by["fast"].score == 5 and by["fast"].credibility == 0.0
    assert by["new"].credibility == 0.5 and by["new"].score == round(0.5 * 10 + 0.5 * 5)


# Few distinct loads and credibilities, so that equal predictions and equal credibilities really occur.
loads = st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0, 40.0]) | st.floats(min_value=0.0, max_value=1e4),
                 min_size=1, max_size=12)
creds = st.lists(st.sampled_from([0.0, 0.3, 0.5, 1.0]) | st.floats(0.0, 1.0), min_size=12, max_size=12)


@settings(max_examples=80, deadline=None)
@given(loads=loads, creds=creds, stale=st.lists(st.booleans(), min_size=12, max_size=12), sla=st.floats(1.0, 1e6))
def test_invariants(loads: list[float], creds: list[float], stale: list[bool], sla: float) -> None:
    b = SnapshotBuilder()
    names = [f"n{i}" for i in range(len(loads))]
    for i, (name, load) in enumerate(zip(names, loads, strict=True)):
        b.apply_node_features(features_msg(name, 1000.0, load))
        b.apply_node_weights(weights_msg(name, 1000.0, creds[i], stale=stale[i]))
    b.set_model("gCTF:gpu", 1, LinearPredictor({"load__mean": 100.0}, bias=1.0))
    params = DecideParams(policy_from_dict({"sla_ms": {"gCTF": sla}, "sla_when_all_fail": "fail",
                                            "exploration": {"share": 0.0}}))
    d = decide(b.build(now=NOW), GCTF, names, AssumedPods(), params, NOW)
    assert all(0 <= s <= 10 for _, s in d.scores())
    assert [v.stale for v in d.verdicts] == stale[: len(names)]  # features are fresh: stale iff weights say so
    fresh = [v for v in d.verdicts if not v.stale]
    if not fresh:
        assert d.neutral == STALE_NODES and d.failed_nodes() == {}
        assert all(v.stale and v.score == 5 for v in d.verdicts)
        return
    assert all(v.failed is None for v in d.verdicts if v.stale)  # stale data never filters
    assert all(v.score == 5 for v in d.verdicts if v.stale)
    assert [v.credibility for v in d.verdicts] == creds[: len(names)]
    best = min(v.predicted_rtt_ms for v in fresh)
    winner = d.best()
    top = dict(d.scores())[winner] if winner is not None else 11
    assert all(s < top for n, s in d.scores() if n != winner)  # the winner alone has the top score
    for a in fresh:
        assert a.predicted_rtt_ms == pytest.approx(1.0 + 100.0 * loads[names.index(a.node)])
        if a.node == winner:
            continue  # one more than a tie (at most 10)
        # a fully credible node is scored on its speed alone: the fastest 10, twice as slow 5 (9 when tied
        # with a winner at 10)
        if a.credibility == 1.0:
            assert abs(a.score - 10 * best / a.predicted_rtt_ms) <= 0.5 or a.score == top - 1 == 9
        if a.credibility == 0.0:
            assert a.score == 5
        for c in fresh:
            if a.credibility == c.credibility and a.predicted_rtt_ms < c.predicted_rtt_ms:
                assert a.score >= c.score  # monotone in the prediction at equal credibility
            if a.predicted_rtt_ms == c.predicted_rtt_ms and a.credibility > c.credibility:
                assert abs(a.score - 5) >= abs(c.score - 5)  # more credible: farther from neutral


def test_a_snapshot_reuses_its_gathers_and_still_sees_each_requests_staleness(view: SnapshotBuilder) -> None:
    """The gathers of a node list are kept per snapshot (kube-scheduler sends the same list pod after pod);
    what depends on the request's time (a node's data going stale) is not."""
    view.apply_node_features(features_msg("late", 1020.0, 3.0))
    view.apply_node_weights(weights_msg("late", 1020.0, 1.0))
    nodes = [*NODES, "late", "unknown-node"]
    snap = view.build(now=1021.0)
    params = DecideParams(policy_from_dict({"exploration": {"share": 0.0}}), credibility_prior=0.5, stale_after_s=30.0)

    def fields(d: object) -> str:  # repr: NaN equals NaN
        names = ("nodes", "score", "rtt_ms", "fresh", "credibility", "model_key", "neutral")
        return repr([getattr(d, f) for f in names])

    early = decide(snap, GCTF, nodes, AssumedPods(), params, 1021.0)
    late = decide(snap, GCTF, nodes, AssumedPods(), params, 1040.0)  # the three first nodes' data are 40 s old
    assert snap.candidates("gCTF", tuple(nodes), 0.5) is snap.candidates("gCTF", tuple(nodes), 0.5)
    assert early.fresh == [True, True, True, True, False] and late.fresh == [False, False, False, True, False]
    assert late.best() == "late" and late.score[:3] == [5, 5, 5]
    for now, d in ((1021.0, early), (1040.0, late)):  # a snapshot that never gathered these nodes: the same answer
        assert fields(d) == fields(decide(view.build(now=1021.0), GCTF, nodes, AssumedPods(), params, now))


def test_a_snapshot_keeps_a_bounded_number_of_read_only_gathers(view: SnapshotBuilder) -> None:
    from app.scheduler.snapshot import MAX_CANDIDATE_LISTS

    snap = view.build(now=NOW)
    first = snap.candidates("gCTF", ("fast",), 0.5)
    with pytest.raises(ValueError, match="read-only"):
        first.at[0] = 1
    for k in range(MAX_CANDIDATE_LISTS + 4):
        snap.candidates("gCTF", ("fast",) * (k + 2), 0.5)
    assert len(snap._candidates) == MAX_CANDIDATE_LISTS
    assert snap.candidates("gCTF", ("fast",), 0.5) is not first  # the oldest went first


def test_the_staleness_bound_is_the_same_for_one_node_and_for_all(view: SnapshotBuilder) -> None:
    """Data exactly ``stale_after_s`` old is fresh, a moment older is not: the check that every candidate is
    fresh (the oldest timestamp of the list) and the check node by node draw the line at the same place."""
    view.apply_node_features(features_msg("late", 1001.0, 3.0))
    view.apply_node_weights(weights_msg("late", 1001.0, 1.0))
    nodes = [*NODES, "late"]
    snap = view.build(now=1001.0)
    params = DecideParams(policy_from_dict({"exploration": {"share": 0.0}}), credibility_prior=0.5, stale_after_s=30.0)
    at_bound = decide(snap, GCTF, nodes, AssumedPods(), params, 1030.0)  # the oldest data: exactly 30 s
    past = decide(snap, GCTF, nodes, AssumedPods(), params, 1030.0 + 1e-9)
    assert at_bound.fresh == [True] * 4 and at_bound.neutral is None
    assert past.fresh == [False, False, False, True] and past.best() == "late"
    assert past.score[:3] == [5, 5, 5]


@given(names=st.lists(st.sampled_from("abcdefghijklmnop"), min_size=1, max_size=24),
       placed=st.sets(st.sampled_from("abcdefghijklmnopqrst"), max_size=8))
@example(names=list("abcdefghijklmnopa"), placed={"a"})  # few placements, one on a name listed twice
@example(names=list("abcdefghijklmnopq"), placed={"q", "z"})
def test_placements_are_found_on_every_candidate_they_name(names: list[str], placed: set[str]) -> None:
    """Whether a candidate holds a remembered placement: looked up from the placements or from the list,
    whichever is shorter, a name listed twice included."""
    from app.scheduler.decide import _placed

    index = {name: i for i, name in reversed(list(enumerate(names)))}
    got = _placed(placed, names, lambda: index)
    assert got.dtype == bool and got.tolist() == [name in placed for name in names]


def test_candidates_covered_by_two_models_get_one_predict_each(view: SnapshotBuilder, linear: LinearPredictor) -> None:
    """The model groups of a node list are gathered once and reused; with a node gone stale the groups are
    made for the fresh ones only."""
    own = make_linear()
    view.set_model("gCTF:gpu:mid", 1, own)
    snap = view.build(now=NOW)
    params = DecideParams(policy_from_dict({"exploration": {"share": 0.0}}), credibility_prior=0.5, stale_after_s=30.0)
    c = snap.candidates("gCTF", tuple(NODES), 0.5)
    entries = snap.app_routes("gCTF").entries
    assert sorted((entries[m].key, picked) for m, _, picked, _ in c.groups) == \
        [("gCTF:gpu", [0, 1]), ("gCTF:gpu:mid", [2])]
    linear.calls.clear(), own.calls.clear()
    d = decide(snap, GCTF, NODES, AssumedPods(), params, NOW)
    assert (linear.calls, own.calls) == ([2], [1])
    assert d.model_key == ["gCTF:gpu", "gCTF:gpu", "gCTF:gpu:mid"] and d.model_version == [3, 3, 1]
    view.apply_node_weights(weights_msg("fast", 1000.0, 1.0, stale=True))
    snap = view.build(now=NOW)
    linear.calls.clear(), own.calls.clear()
    d = decide(snap, GCTF, NODES, AssumedPods(), params, NOW)
    assert (linear.calls, own.calls) == ([1], [1]) and d.fresh == [True, False, True]
    assert d.model_key == ["gCTF:gpu", None, "gCTF:gpu:mid"]
