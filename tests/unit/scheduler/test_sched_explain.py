"""explain: per candidate the model's prediction and what moved it (XGBoost pred_contribs, summing to the margin
the prediction is the link of), the correction, the assumed-pods penalty, anti-affinity, scores, exploration."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import xgboost

from app.model.fast import FastPredictor
from app.scheduler.assumed import AssumedPods
from app.scheduler.builder import SnapshotBuilder
from app.scheduler.decide import DecideParams, decide
from app.scheduler.explain import explain
from app.scheduler.podinfo import PodInfo
from app.scheduler.policy import policy_from_dict

NOW = 1005.0
NAMES = ("load__mean", "task_input_size_mb", "running_pods_gCTF")
LOADS = {"k20": 4.0, "m40": 2.0, "rtx": 0.5, "busy": 1.0}


def _booster(objective: str) -> xgboost.Booster:
    rng = np.random.default_rng(7)
    X = np.column_stack([rng.uniform(0, 5, 3000), rng.uniform(100, 900, 3000), rng.integers(0, 4, 3000)])
    y = 40.0 * np.exp(0.4 * X[:, 0]) * (1 + 0.001 * X[:, 1]) * (1 + 0.3 * X[:, 2]) * rng.gamma(50, 1 / 50, 3000)
    X = X.astype(np.float32)
    X[rng.random(3000) < 0.1, 2] = np.nan
    params = {"objective": objective, "max_depth": 4, "eta": 0.1, "nthread": 1}
    return xgboost.train(params, xgboost.DMatrix(X, label=y, feature_names=list(NAMES)), 60)


def _view(booster: xgboost.Booster) -> SnapshotBuilder:
    b = SnapshotBuilder()
    for node, load in LOADS.items():
        b.apply_node_features({"node": node, "ts": 1000.0, "node_class": "gpu", "gpu_model": "Tesla M40",
                               "window_s": 30.0, "count": 30, "features": {"load__mean": load}})
        b.apply_node_weights({"node": node, "ts": 1000.0, "weight": 0.8, "predicted_rtt_ms": {}, "stale": False,
                              "samples": {"gCTF": 10}})
    b.set_model("gCTF:gpu", 2, FastPredictor.from_booster(booster, NAMES))
    return b


def _explain(view: SnapshotBuilder, booster: xgboost.Booster, policy: dict[str, Any] | None = None,
             assumed: AssumedPods | None = None, **kw: Any) -> dict[str, Any]:
    params = DecideParams(policy_from_dict({"exploration": {"share": 0.0}, **(policy or {})}))
    pod = PodInfo("gctf-1", "em", "uid-1", "gCTF", 512.0)
    return explain(view.build(now=NOW), pod, list(LOADS), assumed or AssumedPods(), params, NOW,
                   lambda key, version: booster, **kw)


@pytest.mark.parametrize("method", ["approx", "exact"])
@pytest.mark.parametrize("objective", ["reg:gamma", "reg:squarederror"])
def test_contributions_sum_to_the_margin_the_prediction_is_the_link_of(objective: str, method: str) -> None:
    booster = _booster(objective)
    view = _view(booster)
    view.apply_node_weights({"node": "m40", "ts": 1001.0, "weight": 0.8, "predicted_rtt_ms": {}, "stale": False,
                             "correction": {"gCTF": 1.5}, "samples": {"gCTF": 10}})
    answer = _explain(view, booster, method=method, top=len(NAMES))
    assert answer["contributions_method"] == method and answer["neutral"] is None
    link = "log" if objective == "reg:gamma" else "identity"
    for n in answer["nodes"]:
        assert n["link"] == link and len(n["contributions"]) == len(NAMES)
        total = sum(c["contribution"] for c in n["contributions"]) + n["bias"]
        assert total == pytest.approx(n["margin"], abs=1e-4)  # XGBoost's own identity, on the margin scale
        through_link = math.exp(n["margin"]) if link == "log" else n["margin"]
        assert through_link == pytest.approx(n["model_rtt_ms"], rel=1e-4)  # the prediction the scheduler used
        assert n["rtt_ms"] == pytest.approx(n["model_rtt_ms"] * n["correction"] * n["penalty"], rel=1e-4)
    by = {n["node"]: n for n in answer["nodes"]}
    assert by["m40"]["correction"] == 1.5 and by["rtx"]["correction"] == 1.0
    assert by["k20"]["contributions"][0]["feature"] == "load__mean"  # the node's load moved it most
    top = answer["nodes"][0]  # sorted by score: the winner first
    assert answer["best"] == "rtx" == top["node"] and top["raw_score"] == 10.0
    assert top["blended_score"] == pytest.approx(9.0) and top["score"] == 9  # credibility 0.8 pulls 10 toward 5


def test_a_node_penalised_by_anti_affinity_says_so() -> None:
    booster = _booster("reg:gamma")
    view = _view(booster)
    assumed = AssumedPods(ttl_s=60, scrape_delay_s=5)
    assumed.assume("uid-0", "Motioncor2", "rtx", now=1004.0)  # just placed, not yet in the metrics
    answer = _explain(view, booster, {"anti_affinity": [["gCTF", "Motioncor2"]]}, assumed)
    by = {n["node"]: n for n in answer["nodes"]}
    rtx = by["rtx"]
    assert rtx["anti_affinity"] == "anti-affinity: gCTF interferes with Motioncor2 just placed on this node"
    assert rtx["failed"] == rtx["anti_affinity"] and rtx["sla"] is None
    assert rtx["assumed_pods"] == ["Motioncor2"]
    assert answer["best"] == "busy"  # the fastest node is filtered out: the next one wins
    assert all(n["anti_affinity"] is None for name, n in by.items() if name != "rtx")


def test_assumed_pods_penalty_sla_and_no_side_effect() -> None:
    booster = _booster("reg:gamma")
    view = _view(booster)
    assumed = AssumedPods(ttl_s=60, scrape_delay_s=5)
    assumed.assume("uid-0", "upload", "rtx", now=1004.0)
    policy = {"contention": {"interfering": 0.5, "other": 0.25}, "sla_ms": {"gCTF": 150.0}}
    answer = _explain(view, booster, policy, assumed)
    by = {n["node"]: n for n in answer["nodes"]}
    assert by["rtx"]["penalty"] == 1.25 and by["m40"]["penalty"] == 1.0
    slow = by["k20"]
    assert slow["rtt_ms"] > 150 and slow["sla"].startswith("predicted RTT") and slow["failed"] == slow["sla"]
    assert answer["sla_ms"] == 150.0
    # explain notes nothing for the pod: placed afterwards, it counts for the whole TTL (no predicted RTT)
    assumed.assume("uid-1", "gCTF", "rtx", now=NOW)
    assert next(p for p in assumed.on_node("rtx", NOW) if p.task_id == "uid-1").until == NOW + 60
    params = DecideParams(policy_from_dict({"exploration": {"share": 0.0}, **policy}))
    decide(view.build(now=NOW), PodInfo("gctf-2", "em", "uid-2", "gCTF", 512.0), list(LOADS), assumed, params, NOW)
    assumed.assume("uid-2", "gCTF", "rtx", now=NOW)  # a real decision does note it
    assert next(p for p in assumed.on_node("rtx", NOW) if p.task_id == "uid-2").until < NOW + 60


def test_scores_credibility_and_exploration_are_shown() -> None:
    booster = _booster("reg:gamma")
    view = _view(booster)
    view.apply_node_weights({"node": "m40", "ts": 1001.0, "weight": 0.0, "predicted_rtt_ms": {}, "stale": False,
                             "samples": {"gCTF": 1}})
    params = {"exploration": {"share": 1.0, "min_samples": 3}}
    answer = _explain(view, booster, params)
    by = {n["node"]: n for n in answer["nodes"]}
    assert by["m40"]["credibility"] == 0.0 and by["m40"]["blended_score"] == 5.0  # no credibility: neutral
    assert by["m40"]["learnt"] is False and by["m40"]["samples"] == 1 and by["m40"]["explored"] is True
    assert answer["explored"] == "m40" == answer["best"] and by["m40"]["score"] == 10 and by["m40"]["tie_break"]
    assert by["rtx"]["raw_score"] == 10.0 and by["rtx"]["learnt"] is True


def test_without_a_booster_the_rest_of_the_answer_stands() -> None:
    booster = _booster("reg:gamma")

    def gone(key: str, version: int) -> Any:
        raise OSError("registry unreachable")

    view = _view(booster)
    params = DecideParams(policy_from_dict({"exploration": {"share": 0.0}}))
    pod = PodInfo("gctf-1", "em", "uid-1", "gCTF", 512.0)
    answer = explain(view.build(now=NOW), pod, list(LOADS), AssumedPods(), params, NOW, gone)
    assert answer["best"] == "rtx"
    assert all(n["contributions"] is None and "registry unreachable" in n["contributions_error"]
               for n in answer["nodes"])
    neutral = explain(None, pod, ["a"], AssumedPods(), params, NOW, gone)
    assert neutral["neutral"] == "not_ready" and neutral["nodes"] == [{"node": "a", "hardware": None, "score": 5}]
