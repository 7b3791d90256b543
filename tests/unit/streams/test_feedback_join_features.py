"""Decision-time task features travel from a prediction into the training sample (and nowhere else)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.contracts import decode, encode
from app.extender.publisher import prediction_values
from app.scheduler.decide import NodeVerdict
from app.streams.feedback_join import _prediction_payload, sample_value
from app.streams.node_state import NodeState


def node() -> NodeState:
    s = NodeState.new("gpu-1", 3, window_s=10.0, history_s=60.0)
    for t in range(100, 130):
        s.update({"node": "gpu-1", "ts": float(t), "node_class": "gpu", "gpu_model": "Tesla M40",
                  "metrics": {"nvidia_smi_utilization_gpu": 50.0}}, partition=3)
    return s


COMPLETION = {"task_id": "t1", "app": "gCTF", "node": "gpu-1", "submitted_ts": 124.0, "started_ts": 125.0,
              "finished_ts": 127.0, "rtt_ms": 2000.0, "status": "ok", "input_size_mb": 8.0}


def published(features: dict[str, float]) -> dict:
    """One rtt-predictions value as the extender publishes it, through its contract."""
    v = NodeVerdict("gpu-1", 7, 1900.0, "gCTF:gpu", 4, 0.9, features=features)
    (value,) = prediction_values("t1", "gCTF", 126.0, [v])
    return decode("rtt-predictions", encode("rtt-predictions", value))


def test_prediction_features_join_the_sample_features() -> None:
    p = _prediction_payload(published({"running_pods_gCTF": 2.0, "running_pods_upload": 0.0}))
    v = sample_value(COMPLETION, "gpu", node(), 10.0, p)
    back = decode("training-samples", encode("training-samples", v))
    assert back["features"]["running_pods_gCTF"] == 2.0 and back["features"]["running_pods_upload"] == 0.0
    assert back["features"]["nvidia_smi_utilization_gpu__mean"] == 50.0
    assert back["predicted_rtt_ms"] == 1900.0


def test_no_prediction_or_no_features_means_no_running_pods() -> None:
    bare = published({})
    assert "features" not in bare and "features" not in _prediction_payload(bare)
    for p in (None, _prediction_payload(bare)):
        v = sample_value(COMPLETION, "gpu", node(), 10.0, p)
        assert not any(k.startswith("running_pods_") for k in v["features"])


def test_a_sample_without_metrics_still_carries_the_prediction_features() -> None:
    v = sample_value(COMPLETION, "gpu", None, 10.0, _prediction_payload(published({"running_pods_gCTF": 1.0})))
    assert v["features"] == {"running_pods_gCTF": 1.0}


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.from_regex(r"running_pods_[A-Za-z0-9]{1,20}", fullmatch=True),
                       st.integers(0, 10_000).map(float), max_size=8))
def test_any_running_pods_map_round_trips_both_contracts(features: dict[str, float]) -> None:
    p = published(features)
    assert p.get("features", {}) == features
    v = sample_value(COMPLETION, "gpu", None, 10.0, _prediction_payload(p))
    assert decode("training-samples", encode("training-samples", v))["features"] == features
