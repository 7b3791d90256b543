"""What the feedback loop gives the scheduler: residual correction, per-app window features, exploration,
and a unique top score for the node the extender assumes."""

from __future__ import annotations

import math

import pytest
from scheduler_fixtures import LinearPredictor, features_msg, make_linear, make_view, weights_msg

from app.scheduler.assumed import AssumedPods
from app.scheduler.builder import SnapshotBuilder
from app.scheduler.decide import DecideParams, decide
from app.scheduler.explore import chosen_to_explore
from app.scheduler.podinfo import PodInfo
from app.scheduler.policy import policy_from_dict
from app.scheduler.scoring import MAX_SCORE

NOW = 1005.0
NODES = ["slow", "fast", "mid"]


def pod(uid: str = "uid-1", app: str = "gCTF") -> PodInfo:
    return PodInfo(uid, "em", uid, app, 512.0)


def run(view: SnapshotBuilder, p: PodInfo | None = None, nodes: list[str] = NODES, assumed: AssumedPods | None = None,
        **exploration: object):
    policy = policy_from_dict({"exploration": exploration or {"share": 0.0}})
    return decide(view.build(now=NOW), p or pod(), nodes, assumed or AssumedPods(), DecideParams(policy), NOW)


@pytest.fixture
def view() -> SnapshotBuilder:
    return make_view(make_linear())


def test_correction_multiplies_predictions_and_is_published(view: SnapshotBuilder) -> None:
    plain = {v.node: v.predicted_rtt_ms for v in run(view).verdicts}
    msg = weights_msg("fast", 1001.0, 1.0)
    view.apply_node_weights({**msg, "correction": {"gCTF": 3.0, "upload": 0.5}})
    d = run(view)
    by = {v.node: v for v in d.verdicts}
    assert by["fast"].predicted_rtt_ms == pytest.approx(3.0 * plain["fast"]) and by["fast"].correction == 3.0
    assert by["mid"].predicted_rtt_ms == pytest.approx(plain["mid"]) and by["mid"].correction == 1.0
    assert d.best() == "mid"  # fast was 201 ms, now 604: mid (301) wins


def test_a_model_reads_its_apps_features_over_the_app_window(view: SnapshotBuilder) -> None:
    msg = features_msg("fast", 1002.0, 1.0)
    view.apply_node_features({**msg, "app_features": {"gCTF": {"load__mean": 6.0}, "upload": {"load__mean": 0.0}}})
    by = {v.node: v.predicted_rtt_ms for v in run(view).verdicts}
    assert by["fast"] == pytest.approx(50 + 600 + 51.2)  # the gCTF window's load, not the node's


def test_the_winner_alone_has_the_top_score(view: SnapshotBuilder) -> None:
    twin = LinearPredictor({"load__mean": 100.0, "task_input_size_mb": 0.1}, bias=50.0)
    view.set_model("gCTF:gpu", 4, twin)
    view.apply_node_features(features_msg("fast2", 1000.0, 1.02))  # 2 ms slower than fast: same raw score
    view.apply_node_weights(weights_msg("fast2", 1000.0, 1.0))
    d = run(view, nodes=["fast2", "fast", "mid"])
    assert d.best() == "fast"
    assert sorted(d.score, reverse=True)[:2] == [MAX_SCORE, MAX_SCORE - 1]
    assert dict(d.scores())["fast"] == MAX_SCORE
    view.apply_node_weights(weights_msg("fast", 1002.0, 0.4))  # less trusted: 0.4 * 10 + 0.6 * 5 = 7
    view.apply_node_weights(weights_msg("fast2", 1002.0, 0.4))
    d = run(view, nodes=["fast2", "fast", "mid"])  # mid: 10 * 201 / 301 = 7 too; fast has the lowest RTT
    assert d.best() == "fast" and d.scores() == [("fast2", 7), ("fast", 8), ("mid", 7)]  # one more than a tie


def learnt(view: SnapshotBuilder, ts: float = 1001.0) -> None:
    for name in NODES:
        view.apply_node_weights({**weights_msg(name, ts, 1.0), "samples": {"gCTF": 3}})


def test_explores_a_node_without_a_model_for_a_share_of_pods(view: SnapshotBuilder) -> None:
    learnt(view)
    view.apply_node_features(features_msg("cpu-1", 1000.0, 0.0, node_class="cpu"))
    view.apply_node_weights(weights_msg("cpu-1", 1000.0, 0.5))
    uids = [f"pod-{i}" for i in range(400)]
    chosen = [u for u in uids if chosen_to_explore(u, 0.25)]
    outcomes = {u: run(view, pod(u), NODES + ["cpu-1"], share=0.25, min_samples=3) for u in uids}
    explored = {u for u, d in outcomes.items() if d.explored == "cpu-1"}
    assert explored == set(chosen) and 70 < len(explored) < 130
    for u in explored:
        d = outcomes[u]
        top = dict(d.scores())["cpu-1"]
        assert d.best() == "cpu-1" and top == 10  # no prediction, yet the top score: every other node below
        assert all(s < top for n, s in d.scores() if n != "cpu-1")
    assert all(outcomes[u].best() == "fast" for u in uids if u not in explored)


def test_one_pod_at_a_time_per_node_and_learnt_nodes_are_left_alone(view: SnapshotBuilder) -> None:
    learnt(view)
    view.apply_node_features(features_msg("cpu-1", 1000.0, 0.0, node_class="cpu"))
    view.apply_node_weights(weights_msg("cpu-1", 1000.0, 0.5))
    uid = next(f"pod-{i}" for i in range(100) if chosen_to_explore(f"pod-{i}", 0.5))
    assumed = AssumedPods()
    assumed.assume("other", "gCTF", "cpu-1", now=NOW - 0.1)
    d = run(view, pod(uid), NODES + ["cpu-1"], assumed, share=0.5, min_samples=3)
    assert d.explored is None and d.best() == "fast"  # cpu-1 already runs one gCTF: not explored again
    # GPU nodes whose samples say they are learnt are never explored; one that is not yet, is
    assert run(view, pod(uid), NODES, share=0.5, min_samples=3).explored is None
    view.apply_node_weights({**weights_msg("slow", 1003.0, 1.0), "samples": {"gCTF": 2}})
    assert run(view, pod(uid), NODES, share=0.5, min_samples=3).explored == "slow"
    assert run(view, pod(uid), NODES, share=0.0, min_samples=3).explored is None


def test_by_default_only_a_class_without_a_model_is_explored(view: SnapshotBuilder) -> None:
    """The default ``min_samples`` is 0: a node the class model covers is placed by its prediction however few
    samples it has (app/scheduler/explore.py), a node of a class no model covers is still explored."""
    learnt(view)
    view.apply_node_weights({**weights_msg("slow", 1003.0, 1.0), "samples": {"gCTF": 0}})
    view.apply_node_features(features_msg("cpu-1", 1000.0, 0.0, node_class="cpu"))
    view.apply_node_weights(weights_msg("cpu-1", 1000.0, 0.5))
    assert policy_from_dict({"exploration": {"share": 1.0}}).explore_min_samples == 0
    d = run(view, pod("uid-9"), NODES, share=1.0)  # min_samples left to its default
    assert d.explored is None and d.best() == "fast"
    assert run(view, pod("uid-9"), NODES + ["cpu-1"], share=1.0).explored == "cpu-1"
    assert run(view, pod("uid-9"), NODES, share=1.0, min_samples=1).explored == "slow"  # asked for: explored


@pytest.mark.parametrize("doc, field", [({"share": 1.5}, "exploration.share"), ({"share": -0.1}, "exploration.share"),
                                        ({"min_samples": -1}, "exploration.min_samples"),
                                        ({"min_samples": 2.5}, "exploration.min_samples")])
def test_bad_exploration_settings_name_the_field(doc, field) -> None:
    from app.errors import ConfigError

    with pytest.raises(ConfigError, match=field):
        policy_from_dict({"exploration": doc})


def test_neutral_answers_have_no_winner() -> None:
    d = run(SnapshotBuilder())
    assert d.neutral is not None and d.best() is None and not math.isnan(d.score[0])
