"""Feature and metric names the model cannot take are refused at the edge, and so are messages with more names than
any producer of this project writes; every name the bridge, the worker, the extender and the trainer make passes.

XGBoost refuses a feature name with ``[``, ``]`` or ``<``: one such name in a key's history used to make every
retrain of the key fail. A training sample with thousands of names used to fill the key's feature vocabulary.
Both now fail the contract (reason ``schema``, the name or the count in the error), on every decoder a consumer
uses, so they go to dead-letters where they are read.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest
import xgboost

from app.bridge.mapping import load_mapping
from app.bridge.snapshot import NodeAssembler, TargetResult
from app.bridge.targets import Endpoint, Target
from app.contracts import contract, decode, encode
from app.contracts.edge import EdgeDecoder
from app.errors import ContractError
from app.features.hardware import HARDWARE_FEATURES
from app.features.node_value import sample_value
from app.features.vector import AGGREGATES, RUNNING_PREFIX, TASK_FEATURES, feature_name
from app.features.window import NodeWindow
from app.scheduler.decide import running_features
from app.sim.metrics import ALL_METRICS

REPO = Path(__file__).resolve().parents[3]
# the exporter pages of this repository and those shared beside it (the same captures, where both exist)
PAGES = sorted({p.name: p for d in (REPO / "tests" / "fixtures" / "exporters", REPO.parent / "shared" / "fixtures"
                                    / "exporters") if d.is_dir() for p in d.glob("*.prom")}.values())
PORTS = {"node_exporter": 9100, "dcgm": 9400, "nvidia_gpu_exporter": 9835, "workload": 9102}
# the contracts' limits (absent before they had any: the tests that use them fail)
FEATURE_NAMES_MAX = contract("training-samples").value_schema["properties"]["features"].get("maxProperties")
METRIC_NAMES_MAX = contract("node-metrics").value_schema["properties"]["metrics"].get("maxProperties")
APPS = ("gCTF", "Motioncor2", "my-app.v2", "a", "A_b-c.d", "x" * 63)
BAD_NAMES = ["gpu_util[0]", "gpu_util]", "a<b", "cpu iowait", "cpu\niowait", "cpu_iowait\n", "\x00", "tab\there",
             "", "-lead", ".lead", "0lead", "é_name", "gpu/util", "a,b", "a\"b", "x" * 201]


def sample(features: dict[str, float], **over: Any) -> dict[str, Any]:
    return {"model_key": "gCTF:gpu", "task_id": "t1", "app": "gCTF", "node": "n1", "node_class": "gpu",
            "gpu_model": "Tesla K20c", "started_ts": 1.7e9, "rtt_ms": 300.0, "input_size_mb": 8.0, "window_s": 30.0,
            "features": features, **over}


def metrics(values: dict[str, float]) -> dict[str, Any]:
    return {"node": "n1", "ts": 1.7e9, "node_class": "gpu", "gpu_model": "Tesla K20c", "metrics": values}


def prediction(features: dict[str, float]) -> dict[str, Any]:
    return {"task_id": "t1", "app": "gCTF", "node": "n1", "ts": 1.7e9, "predicted_rtt_ms": 300.0, "model_version": 1,
            "model_key": "gCTF:gpu", "features": features}


def refusal(topic: str, value: dict[str, Any]) -> list[ContractError]:
    """The errors of the reference decoder and of the edge decoder on ``value`` (both must refuse)."""
    raw = orjson.dumps(value)
    out = []
    for fn in (lambda r: decode(topic, r), EdgeDecoder(topic), EdgeDecoder(topic, typed=False)):
        with pytest.raises(ContractError) as info:
            fn(raw)
        out.append(info.value)
    with pytest.raises(ContractError):
        encode(topic, value)  # what this project writes is held to the same rule
    return out


# -- refused ------------------------------------------------------------------------------------------------------

def test_a_feature_name_xgboost_refuses_is_refused_by_the_training_samples_contract() -> None:
    """The reviewer's sample: 'gpu_util[0]' beside a good feature; refused as a whole, the name in the error."""
    for exc in refusal("training-samples", sample({"gpu_util[0]": 50.0, "cpu_iowait__mean": 1.0})):
        assert exc.reason == "schema"
        assert "data.features" in str(exc) and "'gpu_util[0]'" in str(exc), str(exc)
    with pytest.raises(ValueError, match=r"may not contain \[, \] or <"):  # what it would have met in training
        xgboost.DMatrix([[1.0]], feature_names=["gpu_util[0]"])


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_every_unsafe_name_is_refused_on_each_topic_it_could_come_in_by(name: str) -> None:
    """Brackets, '<', control characters, spaces, an empty name, a leading character no producer writes, a name
    too long: in a training sample, a scrape's metric names (they become ``<metric>__<agg>``) and a prediction's
    task features (they join the sample)."""
    for topic, value in (("training-samples", sample({name: 1.0})), ("node-metrics", metrics({name: 1.0})),
                         ("rtt-predictions", prediction({name: 1.0}))):
        for exc in refusal(topic, value):
            assert exc.reason == "schema", (topic, str(exc))
            assert "must be named by propertyName definition" in str(exc), str(exc)
            if len(name) <= 80:
                assert repr(name) in str(exc), str(exc)
    from app.contracts.names import bad_feature_name, feature_name_ok
    assert not feature_name_ok(name) and bad_feature_name([name, "cpu_iowait__mean"]) == name


def test_a_very_long_bad_name_is_shown_cut() -> None:
    name = "[" * 100_000
    (exc, *_) = refusal("training-samples", sample({name: 1.0}))
    assert len(str(exc)) < 1_000 and "100,000 characters" in str(exc), str(exc)


def test_a_sample_with_more_feature_names_than_any_producer_writes_is_refused() -> None:
    """The reviewer's flood: 2,100 distinct names in one sample."""
    flood = {f"f0_{j}_{'x' * 20}": 0.5 for j in range(2_100)}
    for exc in refusal("training-samples", sample(flood)):
        assert exc.reason == "schema"
        assert f"data.features must contain less than or equal to {FEATURE_NAMES_MAX} properties" in str(exc)
        assert "(it has 2,100)" in str(exc), str(exc)


def test_the_limits_sit_at_their_bounds() -> None:
    at = {f"m{j}": 0.5 for j in range(FEATURE_NAMES_MAX)}
    assert len(decode("training-samples", encode("training-samples", sample(at)))["features"]) == FEATURE_NAMES_MAX
    assert len(EdgeDecoder("training-samples")(orjson.dumps(sample(at)))["features"]) == FEATURE_NAMES_MAX
    refusal("training-samples", sample({**at, "one_more": 1.0}))
    scrape = {f"m{j}": 0.5 for j in range(METRIC_NAMES_MAX)}
    assert len(EdgeDecoder("node-metrics")(encode("node-metrics", metrics(scrape)))["metrics"]) == METRIC_NAMES_MAX
    for exc in refusal("node-metrics", metrics({**scrape, "one_more": 1.0})):
        assert f"must contain less than or equal to {METRIC_NAMES_MAX} properties" in str(exc)


def test_the_limits_are_the_contracts_and_hold_what_the_worker_keeps() -> None:
    """The numbers in code are read from the contracts; a sample holds the aggregates of every metric a worker keeps
    by default (``RTT_FEATURE_MAX_METRICS``) and a running-pods feature per app, with room to spare."""
    from app.config import Settings
    from app.contracts import names
    assert (names.FEATURE_NAMES_MAX, names.METRIC_NAMES_MAX) == (FEATURE_NAMES_MAX, METRIC_NAMES_MAX)
    assert FEATURE_NAMES_MAX == contract("training-samples").value_schema["properties"]["features"]["maxProperties"]
    assert METRIC_NAMES_MAX == contract("node-metrics").value_schema["properties"]["metrics"]["maxProperties"]
    assert FEATURE_NAMES_MAX >= len(AGGREGATES) * Settings.from_env({}).feature_max_metrics + 256
    assert METRIC_NAMES_MAX >= 4 * len(load_mapping().metrics)


# -- accepted -----------------------------------------------------------------------------------------------------

def bridge_messages() -> list[dict[str, Any]]:
    """The node-metrics message the bridge makes of each fixture page (pairs of scrapes: counters become rates)."""
    out = []
    for page in PAGES:
        stem = page.name.split(".scrape-")[0]
        port = next((p for k, p in PORTS.items() if page.name.startswith(k)), 9100)
        url = f"http://10.0.0.9:{port}/metrics"
        a = NodeAssembler(Target("worker-3", (Endpoint(url),)), load_mapping())
        first = a.assemble([TargetResult(url, 0.0, page.read_text())], 1.7e9)
        second = page.with_name(stem + ".scrape-b.prom")
        if page.name.endswith(".scrape-a.prom") and second.exists():
            out.append(a.assemble([TargetResult(url, 8.4, second.read_text())], 1.7e9 + 8.4).message)
        else:
            out.append(first.message)
    return out


def test_every_name_the_bridge_publishes_from_the_fixture_pages_is_accepted_and_trains() -> None:
    """Each exporter page's scrape passes node-metrics; the worker's window of it, with the running-pods features of
    the extender, passes training-samples; the trainer's hardware and task names pass the same rule; XGBoost takes
    them all."""
    messages = bridge_messages()
    assert len(messages) >= 10 and sum(len(m["metrics"]) for m in messages) > 100
    names: set[str] = set()
    for i, m in enumerate(messages):
        assert decode("node-metrics", encode("node-metrics", m)) == m
        assert EdgeDecoder("node-metrics")(orjson.dumps(m))["metrics"] == m["metrics"]
        w = NodeWindow(30.0, history_s=120.0)
        for t in range(5):
            w.update(1.7e9 + t, m["metrics"])
        pred = {"predicted_rtt_ms": 300.0, "model_version": 1,
                "features": running_features(APPS, {"gCTF": 2}, {"my-app.v2": 1})}
        decode("rtt-predictions", encode("rtt-predictions", prediction(pred["features"])))
        completion = {"task_id": f"t{i}", "app": "gCTF", "node": "worker-3", "submitted_ts": 1.7e9,
                      "started_ts": 1.7e9 + 5, "finished_ts": 1.7e9 + 6, "rtt_ms": 1000.0, "status": "ok"}
        value = sample_value(completion, m["node_class"], w, m["gpu_model"], 30.0, pred)
        assert len(value["features"]) == len(m["metrics"]) * len(AGGREGATES) + len(APPS)
        assert decode("training-samples", encode("training-samples", value)) == value
        assert EdgeDecoder("training-samples")(orjson.dumps(value))["features"] == value["features"]
        names |= set(value["features"])
    names |= {*HARDWARE_FEATURES, *TASK_FEATURES}
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.:-]*", n) for n in names), sorted(names)
    xgboost.DMatrix([[0.0] * len(names)], feature_names=sorted(names))


def test_every_canonical_and_simulated_metric_makes_accepted_feature_names() -> None:
    from app.contracts.names import feature_name_ok
    canonical = [m.name for m in load_mapping().metrics]
    for metric in [*canonical, *ALL_METRICS]:
        assert feature_name_ok(metric), metric
        for agg in AGGREGATES:
            assert feature_name_ok(feature_name(metric, agg)), (metric, agg)
    decode("node-metrics", encode("node-metrics", metrics(dict.fromkeys(canonical, 0.5))))
    for app in APPS:
        assert feature_name_ok(RUNNING_PREFIX + app), app


@pytest.mark.parametrize("name", ["cpu_iowait__mean", "running_pods_my-app.v2", "hw_gpu_count", "task_input_size_mb",
                                  "instance:node_cpu:rate5m__max", "_private", "DCGM_FI_DEV_GPU_UTIL__last", "m",
                                  "x" * 200])
def test_names_of_the_safe_alphabet_are_accepted(name: str) -> None:
    from app.contracts.names import feature_name_ok
    assert feature_name_ok(name)
    assert decode("training-samples", encode("training-samples", sample({name: 1.0})))["features"] == {name: 1.0}
    if len(name) <= 194:
        assert decode("node-metrics", encode("node-metrics", metrics({name: 1.0})))["metrics"] == {name: 1.0}
