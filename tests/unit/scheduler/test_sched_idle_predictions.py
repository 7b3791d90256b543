"""decide() remembers what a model predicts for the idle candidates of a snapshot's node list, per the task's
columns as the model keys them: pod after pod, every candidate's prediction is still the number a walk of its
own row through the trees gives."""

from __future__ import annotations

import numpy as np
import xgboost
from hypothesis import given, settings
from hypothesis import strategies as st

from app.model.fast import FastPredictor
from app.scheduler import decide as decide_module
from app.scheduler.assumed import AssumedPods
from app.scheduler.builder import SnapshotBuilder
from app.scheduler.decide import DecideParams, decide, model_rows
from app.scheduler.podinfo import PodInfo
from app.scheduler.policy import policy_from_dict

NOW = 1005.0
NAMES = ("load__mean", "task_input_size_mb", "running_pods_gCTF")
NODES = tuple(f"gpu-{i}" for i in range(12))
PARAMS = DecideParams(policy_from_dict({"exploration": {"share": 0.0}}))


def _predictor() -> FastPredictor:
    rng = np.random.default_rng(3)
    X = np.column_stack([rng.uniform(0, 5, 2000), rng.uniform(100, 900, 2000), rng.integers(0, 4, 2000)])
    y = 40.0 * np.exp(0.4 * X[:, 0]) * (1 + 0.001 * X[:, 1]) * (1 + 0.3 * X[:, 2]) * rng.gamma(50, 1 / 50, 2000)
    booster = xgboost.train({"objective": "reg:gamma", "max_depth": 4, "eta": 0.1, "nthread": 1},
                            xgboost.DMatrix(X.astype(np.float32), label=y, feature_names=list(NAMES)), 40)
    return FastPredictor.from_booster(booster, NAMES)


PREDICTOR = _predictor()


def _snapshot() -> SnapshotBuilder:
    b = SnapshotBuilder()
    for k, node in enumerate(NODES):
        b.apply_node_features({"node": node, "ts": 1000.0, "node_class": "gpu", "gpu_model": "Tesla M40",
                               "window_s": 30.0, "count": 30, "features": {"load__mean": 0.4 * k}})
        b.apply_node_weights({"node": node, "ts": 1000.0, "weight": 0.8, "predicted_rtt_ms": {}, "stale": False})
    b.set_model("gCTF:gpu", 1, PREDICTOR)
    return b


SNAPSHOT = _snapshot().build(now=NOW)


@settings(max_examples=40, deadline=None)
@given(pods=st.lists(st.tuples(st.floats(100.0, 900.0), st.lists(st.sampled_from(NODES), max_size=4)),
                     min_size=1, max_size=6))
def test_every_candidate_gets_the_walk_of_its_own_row(pods: list[tuple[float, list[str]]]) -> None:
    decide_module._IDLE_PREDICTIONS.clear()
    entry = SNAPSHOT.models["gCTF:gpu"]
    rows = np.array([entry.row_index[n] for n in NODES])
    for k, (size, busy_on) in enumerate(pods):  # one snapshot, pod after pod: the remembered idle rows serve
        assumed = AssumedPods(ttl_s=60.0, scrape_delay_s=5.0)
        for j, node in enumerate(busy_on):
            assumed.assume(f"p{k}-{j}", "gCTF", node, now=NOW - 1.0, input_mb=300.0)
        pod = PodInfo(f"t{k}", "em", f"uid-{k}", "gCTF", size)
        d = decide(SNAPSHOT, pod, NODES, assumed, PARAMS, NOW, note_expected=False)
        X = model_rows(entry, rows, pod.task_features(), d.features, {})  # every candidate's own features
        walked = PREDICTOR._walk(np.ascontiguousarray(X, dtype=np.float32))  # no memory: each row walked
        assert d.model_rtt_ms == walked.tolist()
    assert decide_module._IDLE_PREDICTIONS  # the idle rows were remembered
