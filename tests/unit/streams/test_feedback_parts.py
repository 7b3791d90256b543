"""Pure parts of the feedback loop: training samples, prediction-errors values, debounce, options, row keys."""

from __future__ import annotations

import pytest

from app.config import Settings
from app.contracts import decode, encode
from app.drift.tracker import NodeTracker
from app.errors import ConfigError
from app.streams.feedback_errors import Debounce, errors_value
from app.streams.feedback_join import class_of, sample_value
from app.streams.feedback_options import FeedbackOptions
from app.streams.node_state import NodeState


def node_with_history() -> NodeState:
    """A GPU node whose utilisation is 10 until t=130 and 90 after."""
    s = NodeState.new("gpu-1", 3, window_s=10.0, history_s=120.0)
    for t in range(100, 160):
        s.update({"node": "gpu-1", "ts": float(t), "node_class": "gpu", "gpu_model": "Tesla M40",
                  "metrics": {"nvidia_smi_utilization_gpu": 10.0 if t < 130 else 90.0}}, partition=3)
    return s


def completion(started: float, status: str = "ok") -> dict:
    return {"task_id": "t1", "app": "gCTF", "node": "gpu-1", "submitted_ts": started - 1, "started_ts": started,
            "finished_ts": started + 2, "rtt_ms": 2000.0, "status": status, "input_size_mb": 8.0}


def test_sample_uses_the_window_before_the_task_started_not_the_latest_values() -> None:
    state = node_with_history()
    v = sample_value(completion(125.5), "gpu", state, 10.0)
    assert v["features"]["nvidia_smi_utilization_gpu__mean"] == 10.0  # buckets 116..125, all before the jump
    assert v["features"]["nvidia_smi_utilization_gpu__max"] == 10.0
    straddle = sample_value(completion(134.0), "gpu", state, 10.0)["features"]
    assert straddle["nvidia_smi_utilization_gpu__mean"] == pytest.approx((5 * 10.0 + 5 * 90.0) / 10)
    latest = state.features_value()["features"]["nvidia_smi_utilization_gpu__mean"]
    assert latest == 90.0


def test_sample_window_follows_the_dwa_window() -> None:
    state = node_with_history()
    short = sample_value(completion(134.0), "gpu", state, 5.0)["features"]
    assert short["nvidia_smi_utilization_gpu__mean"] == 90.0  # buckets 130..134


def test_sample_satisfies_the_contract_and_carries_what_the_trainer_reads() -> None:
    v = sample_value(completion(125.5), "gpu", node_with_history(), 10.0,
                     {"predicted_rtt_ms": 1900.0, "model_version": 4})
    back = decode("training-samples", encode("training-samples", v))
    assert back["model_key"] == "gCTF:gpu" and back["gpu_model"] == "Tesla M40" and back["input_size_mb"] == 8.0
    assert back["predicted_rtt_ms"] == 1900.0 and back["model_version"] == 4 and back["window_s"] == 10.0


def test_sample_of_a_node_without_metrics_has_no_features() -> None:
    v = sample_value(completion(125.5), "cpu", None, 30.0)
    assert v["features"] == {} and v["model_key"] == "gCTF:cpu" and v["predicted_rtt_ms"] is None
    decode("training-samples", encode("training-samples", v))


def test_node_class_from_metrics_else_from_the_prediction() -> None:
    assert class_of(node_with_history(), None) == "gpu"
    empty = NodeState.new("x", 0, window_s=10.0, history_s=60.0)
    assert class_of(empty, {"model_key": "upload:cpu"}) == "cpu"
    assert class_of(empty, {"model_key": "nonsense"}) is None
    assert class_of(None, None) is None


def test_errors_value_satisfies_the_contract() -> None:
    t = NodeTracker(30.0)
    for p, a in [(100.0, 120.0), (90.0, 80.0)]:
        t.add("gCTF", p, a)
    v = errors_value("gpu-1", "gpu", 1000.0, 5.0, t.close(1000.0))
    back = decode("prediction-errors", encode("prediction-errors", v))
    entry = back["apps"]["gCTF"]
    assert entry["n"] == 2 and entry["model_key"] == "gCTF:gpu" and entry["rmse_ms"] == pytest.approx(15.811, abs=1e-3)
    assert "cumulative" in entry and back["node_class"] == "gpu" and back["period_s"] == 5.0


def test_debounce_per_key() -> None:
    d = Debounce(10.0)
    assert d.allow("a", 0.0) and d.allow("b", 1.0)
    assert not d.allow("a", 9.9)
    assert d.allow("a", 10.0)
    assert Debounce(0.0).allow("a", 0.0) and Debounce(0.0).allow("a", 0.0)


def test_options_from_environment_and_validation() -> None:
    env = {"RTT_DRIFT_MIN_INSTANCES": "5", "RTT_DRIFT_THRESHOLD": "0.8"}
    o = FeedbackOptions.from_settings(Settings.from_env(env))
    assert (o.drift_min_instances, o.drift_threshold, o.cold_start_samples) == (5, 0.8, 50)
    with pytest.raises(ConfigError, match="RTT_COLD_START_SAMPLES"):
        Settings.from_env({"RTT_COLD_START_SAMPLES": "many"})
    with pytest.raises(ConfigError, match="RTT_JOIN_MAX_ENTRIES: must be >= 1"):
        FeedbackOptions(join_max_entries=0)
