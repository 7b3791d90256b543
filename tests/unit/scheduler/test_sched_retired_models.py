"""A model replaced by a retrain, and the node rows of snapshots gone by, are freed once no snapshot refers to
them: what the scheduling layer remembers between requests (column layouts, contention factors) keeps no model
entry alive in a long-running extender."""

from __future__ import annotations

import gc
import weakref

from scheduler_fixtures import LinearPredictor, features_msg, make_view

from app.scheduler.assumed import AssumedPods
from app.scheduler.decide import DecideParams, decide
from app.scheduler.podinfo import PodInfo
from app.scheduler.policy import policy_from_dict

NOW = 1005.0
NODES = ["slow", "fast", "mid"]
UPLOAD = PodInfo("up-1", "em", "uid-up", "upload", 100.0)
PARAMS = DecideParams(policy_from_dict({"objective": {"inflicted": 1.0}, "exploration": {"share": 0.0}}))


def gctf_model(per_upload_ms: float) -> LinearPredictor:
    return LinearPredictor({"load__mean": 100.0, "running_pods_upload": per_upload_ms, "running_pods_gCTF": 10.0},
                           bias=50.0)


def gctf_running_on_fast() -> AssumedPods:
    a = AssumedPods(ttl_s=60.0)
    a.assume("ctf-1", "gCTF", "fast", now=NOW - 1.0, input_mb=512.0)
    return a


def test_a_retired_model_and_old_node_rows_are_freed_after_pricing_slowdowns() -> None:
    old = gctf_model(1000.0)
    v = make_view(old)
    v.set_model("upload:gpu", 1, LinearPredictor({"load__mean": 100.0}, bias=50.0))
    snap = v.build(now=NOW)
    d = decide(snap, UPLOAD, NODES, gctf_running_on_fast(), PARAMS, NOW)
    assert d.inflicted_ms[NODES.index("fast")] > 0  # the old model priced the running gCTF pod's slowdown
    retired = weakref.ref(old)
    old_rows = weakref.ref(snap.models["gCTF:gpu"].matrix)
    del old, d, snap
    for k in range(3):  # a retrain, then node-features moving on: new entries every build
        if k == 0:
            v.set_model("gCTF:gpu", 4, gctf_model(2000.0))
        v.apply_node_features(features_msg("fast", 1001.0 + k, 1.5 + k))
        d = decide(v.build(now=NOW + k), UPLOAD, NODES, gctf_running_on_fast(), PARAMS, NOW + k)
        assert d.inflicted_ms[NODES.index("fast")] > 0
    del d
    gc.collect()
    assert retired() is None
    assert old_rows() is None
