from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.contracts import TOPIC_NAMES, decode, encode, load_contracts
from app.errors import ContractError


def test_every_design_topic_has_a_contract_file():
    contracts = load_contracts()
    assert set(contracts) == set(TOPIC_NAMES)
    for c in contracts.values():
        assert c.partitions >= 1
        assert c.cleanup_policy in {"delete", "compact"}
        assert c.value_schema["type"] == "object"


@pytest.mark.parametrize("name", ["node-features", "model-updates", "node-weights"])
def test_latest_state_topics_are_compacted(name):
    assert load_contracts()[name].compacted


def _metrics(**over):
    v = {"node": "worker-3", "ts": 1_700_000_000.0, "node_class": "gpu", "gpu_model": "RTX 4090",
         "metrics": {"nvidia_smi_utilization_gpu": 0.7}}
    v.update(over)
    return v


def test_roundtrip_valid_message():
    raw = encode("node-metrics", _metrics())
    assert decode("node-metrics", raw) == _metrics()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\x00\xff garbage", "invalid_json"),
        (b"[1,2]", "not_an_object"),
        (b'{"node":"n","ts":1,"node_class":"gpu","metrics":{"a":NaN}}', "invalid_json"),
        (b'{"node":"n","ts":1,"node_class":"gpu","metrics":{"a":1e400}}', "invalid_json"),
        (b'{"node":"n","ts":1,"node_class":"gpu","metrics":{"a":1e300}}', "schema"),
        (b'{"node":"n","ts":"x","node_class":"gpu","metrics":{}}', "schema"),
        (b'{"node":"n","ts":1,"node_class":"tpu","metrics":{}}', "schema"),
        (b'{"node":"n","ts":1,"metrics":{}}', "schema"),
        (None, "empty"),
    ],
)
def test_bad_messages_give_a_stable_reason(raw, reason):
    with pytest.raises(ContractError) as info:
        decode("node-metrics", raw)
    assert info.value.reason == reason


def test_encode_refuses_what_decode_would_refuse():
    with pytest.raises(ContractError):
        encode("node-metrics", _metrics(node_class="tpu"))


@given(st.binary(max_size=300))
def test_decoder_never_crashes_on_bytes(raw):
    for topic in TOPIC_NAMES:
        try:
            value = decode(topic, raw)
        except ContractError as exc:
            assert exc.reason
        else:
            assert isinstance(value, dict)


METRIC_NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.:-]{0,19}", fullmatch=True)  # the contract's metric names


@given(st.dictionaries(METRIC_NAME, st.floats(allow_nan=False, allow_infinity=False), max_size=10))
def test_any_finite_metric_map_within_bounds_is_accepted(metrics):
    bounded = {k: v for k, v in metrics.items() if abs(v) <= 1e15}
    out = decode("node-metrics", encode("node-metrics", _metrics(metrics=bounded)))
    assert all(math.isfinite(v) for v in out["metrics"].values())


@pytest.mark.parametrize("extra", [
    {"predicted_rtt_ms": {"": 5.0}},  # an app named "" took over the extender's per-app table
    {"predicted_rtt_ms": {"gCTF": 5.0}, "correction": {"": 2.0}},
    {"predicted_rtt_ms": {"gCTF": 5.0}, "samples": {"": 3}},
    {"predicted_rtt_ms": {"gCTF": 5.0}, "samples": {"gCTF": 10**13}},  # past the extender's int64 count
])
def test_node_weights_refuse_what_the_extender_cannot_take(extra):
    from app.contracts.edge import EdgeDecoder

    value = {"node": "n1", "ts": 1.0, "weight": 1.0, "stale": False, **extra}
    raw = orjson.dumps(value)
    with pytest.raises(ContractError):
        decode("node-weights", raw)
    with pytest.raises(ContractError):
        EdgeDecoder("node-weights")(raw)


def test_a_metric_name_leaves_room_for_its_feature_suffix():
    snapshot = {"node": "n1", "ts": 1.0, "node_class": "cpu", "metrics": {"m" * 195: 1.0}}
    with pytest.raises(ContractError):
        decode("node-metrics", orjson.dumps(snapshot))
    name = "m" * 194 + "__mean"  # the longest feature a 194-character metric makes
    features = {"node": "n1", "ts": 1.0, "node_class": "cpu", "window_s": 30.0, "count": 1, "features": {name: 1.0}}
    assert decode("node-features", orjson.dumps(features))["features"] == {name: 1.0}


def test_a_dead_letter_of_a_huge_line_keeps_only_its_first_bytes():
    import base64

    from app.bridge.producer import dead_letter
    from app.config import Settings
    from app.contracts.dead import MAX_RAW_BYTES

    letter = dead_letter(Settings(), "task-completions", b"x" * 900_000, "invalid_json: ...", reason="invalid_json",
                         offset=1, ts=0.0)
    assert len(base64.b64decode(letter["raw"])) == MAX_RAW_BYTES
    assert len(encode("dead-letters", letter)) < 1_048_576  # within the codec's message bound



def test_a_training_sample_s_input_size_is_bounded():
    sample = {"model_key": "gCTF:gpu", "task_id": "t1", "app": "gCTF", "node": "n1", "node_class": "gpu",
              "started_ts": 1.0, "rtt_ms": 100.0, "features": {}, "input_size_mb": 512.0}
    assert decode("training-samples", orjson.dumps(sample))["input_size_mb"] == 512.0
    with pytest.raises(ContractError):  # 1e39 is inf in the trainer's float32 history: no retrain could use it
        decode("training-samples", orjson.dumps({**sample, "input_size_mb": 1e39}))


def test_a_uid_less_pod_s_task_id_fits_every_contract_that_carries_it():
    from app.scheduler.podinfo import pod_info

    pod = pod_info({"metadata": {"name": "p" * 253, "namespace": "n" * 63, "labels": {"rttsched.io/app": "gCTF"}}})
    assert len(pod.task_id) == 317  # namespace/name, Kubernetes' longest
    prediction = {"task_id": pod.task_id, "app": "gCTF", "node": "n1", "ts": 1.0, "predicted_rtt_ms": 5.0,
                  "model_version": None, "model_key": None}
    assert decode("rtt-predictions", orjson.dumps(prediction))["task_id"] == pod.task_id


def test_a_prediction_may_mark_the_node_the_pod_was_assumed_on():
    """``chosen`` is optional (a prediction without it, as older extenders send, is not chosen) and a boolean:
    anything else goes to dead-letters with the contract's reason."""
    from app.contracts.dead import dead_letter_value
    from app.contracts.edge import EdgeDecoder

    edge = EdgeDecoder("rtt-predictions")
    prediction = {"task_id": "uid-1", "app": "gCTF", "node": "n1", "ts": 1.0, "predicted_rtt_ms": 5.0,
                  "model_version": 3, "model_key": "gCTF:gpu"}
    assert "chosen" not in edge(orjson.dumps(prediction))
    for chosen in (True, False):
        raw = encode("rtt-predictions", {**prediction, "chosen": chosen})
        assert edge(raw)["chosen"] is chosen and decode("rtt-predictions", raw)["chosen"] is chosen
    for bad in (1, 0, "true", None, [True]):
        raw = orjson.dumps({**prediction, "chosen": bad})
        with pytest.raises(ContractError) as info:
            edge(raw)
        with pytest.raises(ContractError) as reference:
            decode("rtt-predictions", raw)
        assert (info.value.reason, str(info.value)) == (reference.value.reason, str(reference.value))
        letter = dead_letter_value("rtt-predictions", 0, 7, str(info.value), info.value.reason, raw, "n1", 1.0)
        assert letter["reason"] == "schema" and "data.chosen must be boolean" in letter["error"]
        assert decode("dead-letters", encode("dead-letters", letter)) == letter
