"""Jaeger and OTLP span JSON -> exact task-completions; malformed spans raise ContractError."""

from __future__ import annotations

import base64
import copy
import datetime
import json
import math

import orjson
import pytest
from bridge_fixtures import SPANS
from hypothesis import given, settings
from hypothesis import strategies as st

from app.bridge.jaeger import jaeger_span_to_completion, jaeger_to_completions, parse_duration
from app.bridge.otlp import otlp_to_completions
from app.bridge.spans import STATUSES, SpanOptions, completion_from_span, parse_rfc3339
from app.contracts.codec import validate
from app.contracts.keys import model_key
from app.errors import ContractError
from app.features.node_value import sample_value
from app.registry.base import check_model_key
from app.registry.directory import DirectoryModelStore

JAEGER = json.loads((SPANS / "jaeger-span.json").read_text())
OTLP = json.loads((SPANS / "otlp-export.json").read_text())


def test_jaeger_span_to_exact_completion():
    assert jaeger_span_to_completion(JAEGER) == {
        "task_id": "ctf-000417", "app": "gCTF", "node": "worker-3",
        "submitted_ts": 1796119195.5,  # rtt.submitted_ts (vFloat64)
        "started_ts": 1796119202.25,  # 2026-12-01T10:00:02.250Z
        "finished_ts": 1796119243.625,  # + 41.375s
        "rtt_ms": 48125.0, "status": "ok", "input_size_mb": 1843.0,
    }


def test_otlp_export_to_exact_completions_skipping_the_span_that_is_no_task():
    batch = otlp_to_completions(OTLP)
    assert batch.skipped == 1 and batch.errors == []
    assert batch.completions == [
        {"task_id": "mc2-000981", "app": "Motioncor2", "node": "worker-1", "submitted_ts": 1796119257.0,
         "started_ts": 1796119260.0, "finished_ts": 1796119378.5, "rtt_ms": 121500.0, "status": "ok",
         "input_size_mb": 3072.5},
        # no rtt.app: the span name; span-level k8s.node.name beats the resource's; status code 2: failed
        {"task_id": "up-002210", "app": "upload", "node": "worker-2", "submitted_ts": 1796119300.25,
         "started_ts": 1796119300.25, "finished_ts": 1796119302.75, "rtt_ms": 2500.0, "status": "failed"},
    ]
    for c in batch.completions:
        validate("task-completions", c)


def test_jaeger_fallbacks_span_id_service_hostname_and_error_tag():
    span = copy.deepcopy(JAEGER)
    span["tags"] = [{"key": "rtt.app", "vStr": "gCTF"}, {"key": "error", "vType": "BOOL", "vBool": True}]
    c = jaeger_span_to_completion(span)
    assert c["task_id"] == "643f5373d261be13"  # the span id, base64 -> hex
    assert c["node"] == "cryoem-runner-7d9f6c5b8-x2k4q"  # process tag hostname
    assert c["submitted_ts"] == c["started_ts"] and c["rtt_ms"] == 41375.0
    assert c["status"] == "failed"


def test_a_span_that_is_no_task_is_skipped_and_counted():
    span = copy.deepcopy(JAEGER)
    span["tags"] = [{"key": "http.method", "vStr": "GET"}]
    assert jaeger_span_to_completion(span) is None
    assert jaeger_to_completions([span, JAEGER]).skipped == 1


@pytest.mark.parametrize(("field", "value", "detail"), [
    ("spanId", "not base64!", "spanId"),
    ("startTime", "yesterday", "RFC 3339"),
    ("duration", "41.375", "Duration"),
    ("duration", "-1s", "ends before it starts"),
    ("tags", [{"key": "rtt.task_id", "vStr": "t"}, {"key": "rtt.status", "vStr": "done"}], "rtt.status"),
    ("tags", [{"key": "rtt.task_id", "vInt64": "x"}], "vInt64"),
    ("tags", "rtt.task_id=1", "tags"),
])
def test_malformed_jaeger_task_spans_raise_contract_error(field, value, detail):
    span = copy.deepcopy(JAEGER)
    span[field] = value
    with pytest.raises(ContractError, match=detail) as err:
        jaeger_span_to_completion(span)
    assert err.value.reason == "bad_span"


def test_a_task_span_without_a_node_is_malformed():
    span = copy.deepcopy(OTLP)
    span["resourceSpans"][0]["resource"]["attributes"] = []
    batch = otlp_to_completions(span)
    assert [c["task_id"] for c in batch.completions] == ["up-002210"]  # its node is on the span
    assert len(batch.errors) == 1 and "k8s.node.name" in str(batch.errors[0])


@pytest.mark.parametrize("doc", [[], "x", {"resourceSpans": {}}, {"resourceSpans": [1]}, {"foo": 1},
                                 {"task_id": "t-1", "app": "gCTF", "node": "worker-1", "rtt_ms": 4000.0}])
def test_a_document_that_is_no_otlp_export_raises(doc):
    with pytest.raises(ContractError):
        otlp_to_completions(doc)


def test_an_empty_export_is_an_empty_batch():
    batch = otlp_to_completions({})  # OTLP's JSON leaves an empty resourceSpans out
    assert batch.completions == [] and batch.errors == []


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)

# Spans close to real ones (what the conventions read, with values in and out of range, NaN and infinities
# included), mixed with arbitrary JSON: every span must end as exactly one completion, skip or error.
TAG_KEYS = ["rtt.task_id", "rtt.app", "rtt.status", "rtt.submitted_ts", "rtt.input_size_mb", "k8s.node.name",
            "k8s.pod.name", "host.name", "error", "otel.status_code", "other"]
WORDS = st.sampled_from(["ok", "failed", "cancelled", "ERROR", "true", "worker-1", "gCTF", "1796119200.5",
                         "2026-12-01T10:00:00Z", "", "-1", "1e309"]) | st.text(max_size=10)
FLOATS = st.floats() | st.floats(min_value=1.7e9, max_value=1.9e9) | st.sampled_from([0.0, -1.0, 1e12, 1e300])
STAMPS = st.datetimes(min_value=datetime.datetime(1960, 1, 1), max_value=datetime.datetime(5000, 1, 1)).map(
    lambda d: d.isoformat(timespec="microseconds") + "Z")
jaeger_tag = st.one_of(
    st.builds(lambda k, v: {"key": k, "vStr": v}, st.sampled_from(TAG_KEYS), WORDS),
    st.builds(lambda k, v: {"key": k, "vType": "FLOAT64", "vFloat64": v}, st.sampled_from(TAG_KEYS), FLOATS),
    st.builds(lambda k, v: {"key": k, "vType": "INT64", "vInt64": str(v)}, st.sampled_from(TAG_KEYS), st.integers()),
    st.builds(lambda k, v: {"key": k, "vType": "BOOL", "vBool": v}, st.sampled_from(TAG_KEYS), st.booleans()),
)
TASK_TAGS = [{"key": "rtt.task_id", "vStr": "t-1"}, {"key": "k8s.node.name", "vStr": "worker-1"}]
jaeger_span = st.fixed_dictionaries(
    {"spanId": st.binary(min_size=8, max_size=8).map(lambda b: base64.b64encode(b).decode()),
     "startTime": STAMPS,
     "duration": st.floats(min_value=-5, max_value=1e11).map(lambda d: f"{d:.6f}s"),
     "tags": st.builds(lambda task, size, more: (TASK_TAGS if task else []) + size + more, st.booleans(),
                       st.lists(st.floats(0, 1e4).map(lambda v: {"key": "rtt.input_size_mb", "vFloat64": v}),
                                max_size=1), st.lists(jaeger_tag, max_size=6))},
    optional={"operationName": WORDS, "references": st.just([]) | json_values,
              "process": st.fixed_dictionaries({"serviceName": WORDS, "tags": st.lists(jaeger_tag, max_size=3)})},
)
otlp_attr = st.one_of(
    st.builds(lambda k, v: {"key": k, "value": {"stringValue": v}}, st.sampled_from(TAG_KEYS), WORDS),
    st.builds(lambda k, v: {"key": k, "value": {"doubleValue": v}}, st.sampled_from(TAG_KEYS), FLOATS),
    st.builds(lambda k, v: {"key": k, "value": {"intValue": str(v)}}, st.sampled_from(TAG_KEYS), st.integers()),
    st.builds(lambda k, v: {"key": k, "value": {"boolValue": v}}, st.sampled_from(TAG_KEYS), st.booleans()),
)
NANOS = (st.integers(min_value=1_700_000_000 * 10**9, max_value=1_900_000_000 * 10**9).map(str)
         | st.integers(min_value=-10, max_value=4 * 10**20).map(str) | st.integers(min_value=0, max_value=2**70))
OTLP_TASK = [{"key": "rtt.app", "value": {"stringValue": "gCTF"}},
             {"key": "k8s.node.name", "value": {"stringValue": "worker-2"}}]
otlp_span = st.fixed_dictionaries(
    {"spanId": st.binary(min_size=8, max_size=8).map(bytes.hex), "startTimeUnixNano": NANOS,
     "endTimeUnixNano": NANOS,
     "attributes": st.builds(lambda task, more: (OTLP_TASK if task else []) + more, st.booleans(),
                             st.lists(otlp_attr, max_size=6))},
    optional={"name": WORDS, "parentSpanId": st.just("") | st.binary(min_size=8, max_size=8).map(bytes.hex),
              "status": st.fixed_dictionaries({"code": st.sampled_from([0, 1, 2, "STATUS_CODE_ERROR"])})},
)


def check_completion(c: dict) -> None:
    """What every completion the decoders make must satisfy, whatever the span looked like."""
    assert validate("task-completions", c) == c
    numbers = [c["submitted_ts"], c["started_ts"], c["finished_ts"], c["rtt_ms"], *[c.get("input_size_mb", 0.0)]]
    assert all(isinstance(v, float) and math.isfinite(v) for v in numbers), c  # NaN passes a JSON Schema minimum
    assert orjson.loads(orjson.dumps(c)) == c  # what goes on the topic is what was made
    assert c["started_ts"] <= c["finished_ts"] and c["submitted_ts"] <= c["finished_ts"]
    assert c["rtt_ms"] == pytest.approx((c["finished_ts"] - c["submitted_ts"]) * 1000.0, rel=1e-9, abs=1e-3)
    assert c["status"] in STATUSES
    assert check_model_key(model_key(c["app"], "gpu")) == model_key(c["app"], "gpu")  # its models can be stored


@settings(max_examples=300, deadline=None)
@given(st.lists(jaeger_span | json_values, max_size=4))
def test_jaeger_spans_each_end_as_one_outcome_and_every_completion_is_in_range(spans):
    batch = jaeger_to_completions(spans)
    assert len(batch.completions) + batch.skipped + len(batch.errors) == len(spans)
    assert all(isinstance(e, ContractError) and e.reason for e in batch.errors)
    for c in batch.completions:
        check_completion(c)
    for span in spans:  # a single span: the times are those the span carries
        one = jaeger_to_completions(span) if isinstance(span, dict) and "data" not in span else None
        if one is not None and one.completions:
            [c] = one.completions
            assert c["started_ts"] == parse_rfc3339(span["startTime"])
            assert c["finished_ts"] - c["started_ts"] == pytest.approx(parse_duration(span["duration"]), abs=1e-3)


@settings(max_examples=300, deadline=None)
@given(st.lists(otlp_span | json_values, max_size=4), st.lists(otlp_attr, max_size=3))
def test_otlp_spans_each_end_as_one_outcome_and_every_completion_is_in_range(spans, resource):
    doc = {"resourceSpans": [{"resource": {"attributes": resource}, "scopeSpans": [{"spans": spans}]}]}
    try:
        batch = otlp_to_completions(doc)
    except ContractError as exc:  # only a resource that is not a list of attributes fails the whole export
        assert exc.reason == "bad_export"
        return
    assert len(batch.completions) + batch.skipped + len(batch.errors) == len(spans)
    for c in batch.completions:
        check_completion(c)
    for span in spans:  # a single span: the times are those the span carries
        if not (isinstance(span, dict) and "startTimeUnixNano" in span):
            continue
        one = otlp_to_completions({"resourceSpans": [{"resource": {"attributes": resource},
                                                      "scopeSpans": [{"spans": [span]}]}]})
        if one.completions:
            [c] = one.completions
            start_ns, end_ns = int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"])
            assert c["started_ts"] == pytest.approx(start_ns / 1e9, rel=1e-12)
            assert c["finished_ts"] - c["started_ts"] == pytest.approx((end_ns - start_ns) / 1e9, abs=1e-3)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_an_otlp_document_of_any_shape_is_a_batch_or_a_contract_error(doc):
    for d in (doc, {"resourceSpans": [{"scopeSpans": [{"spans": [doc]}]}]}):
        try:
            batch = otlp_to_completions(d)
        except ContractError as exc:
            assert exc.reason in ("not_an_object", "bad_export")
            continue
        for c in batch.completions:
            check_completion(c)


# -- node attribution, resource attributes, Jaeger query API, base64 OTLP ids

QUERY = json.loads((SPANS / "jaeger-query-traces.json").read_text())
OTLP64 = json.loads((SPANS / "otlp-export-base64.json").read_text())
MC2_POD = "mc2-runner-6f7d9c8b5-k2x7p"
GCTF_POD = "gctf-runner-5d4c7b9f8-q8w3e"


def test_jaeger_query_api_response_to_exact_completions():
    batch = jaeger_to_completions(QUERY, SpanOptions(node_map={MC2_POD: "worker-3"}))
    assert batch.errors == [] and batch.skipped == 1  # read-input: a CHILD_OF span of a resource-level app
    assert batch.completions == [
        # a root span of a process whose tags carry rtt.app: the task; its id is the span's; times in µs
        {"task_id": "a1b2c3d4e5f60718", "app": "Motioncor2", "node": "worker-3", "submitted_ts": 1796119500.0,
         "started_ts": 1796119500.0, "finished_ts": 1796119561.25, "rtt_ms": 61250.0, "status": "ok",
         "input_size_mb": 3072.0},
        # FOLLOWS_FROM is no parent; its own tags name task, app and node; error=true: failed
        {"task_id": "ctf-000502", "app": "gCTF", "node": "worker-2", "submitted_ts": 1796119558.5,
         "started_ts": 1796119561.5, "finished_ts": 1796119573.625, "rtt_ms": 15125.0, "status": "failed"},
    ]
    assert batch.fallbacks == {}


def test_jaeger_query_api_through_the_records_reader_is_one_record():
    import io

    from app.bridge.records import convert, read_records

    [record] = list(read_records(io.BytesIO((SPANS / "jaeger-query-traces.json").read_bytes())))
    out = convert(record, "task-completions", "jaeger")
    assert [c["node"] for c in out.values] == [MC2_POD, "worker-2"] and out.fallbacks == {"host.name": 1}
    with pytest.raises(ValueError, match="source must be one of values, jaeger, otlp"):
        convert(record, "task-completions", "zipkin")  # never read as OTLP by default


def test_otlp_base64_ids_and_the_app_on_the_resource():
    batch = otlp_to_completions(OTLP64, SpanOptions(node_map={GCTF_POD: "worker-1"}))
    assert batch.errors == [] and batch.skipped == 1  # write-output: a child span
    assert batch.completions == [
        {"task_id": "b7ad6b7169203331", "app": "gCTF", "node": "worker-1", "submitted_ts": 1796119600.25,
         "started_ts": 1796119600.25, "finished_ts": 1796119611.0, "rtt_ms": 10750.0, "status": "ok",
         "input_size_mb": 812.5}]


@pytest.mark.parametrize("raw", ["t61rcWkgMzE=", "t61rcWkgMzE", "b7ad6b7169203331", "B7AD6B7169203331"])
def test_a_span_id_in_hex_or_base64_is_the_same_id(raw):
    from app.bridge.otlp import span_id_hex

    assert span_id_hex("spanId", raw) == "b7ad6b7169203331"


@pytest.mark.parametrize("raw", ["", "xyz", "t61rcWkgMzE==", "AAAAAAAAAAAAAAAA=", 12345, None])
def test_a_span_id_that_is_neither_is_malformed(raw):
    from app.bridge.otlp import span_id_hex

    with pytest.raises(ContractError, match="spanId"):
        span_id_hex("spanId", raw)


def test_host_name_is_the_node_only_as_a_counted_fallback():
    batch = otlp_to_completions(OTLP64)
    assert [c["node"] for c in batch.completions] == [GCTF_POD]
    assert batch.fallbacks == {"host.name": 1}
    span = copy.deepcopy(JAEGER)
    span["tags"] = [t for t in span["tags"] if t["key"] != "k8s.node.name"]
    batch = jaeger_to_completions(span)
    assert batch.completions[0]["node"] == "cryoem-runner-7d9f6c5b8-x2k4q" and batch.fallbacks == {"hostname": 1}


def test_a_completion_on_a_node_without_metrics_is_an_unknown_node_error():
    batch = otlp_to_completions(OTLP64, SpanOptions(known_nodes={"worker-1", "worker-2", "worker-3"}))
    assert batch.completions == []
    [err] = batch.errors
    assert err.reason == "unknown_node" and GCTF_POD in str(err) and "pod's name" in str(err)
    ok = otlp_to_completions(OTLP64, SpanOptions({GCTF_POD: "worker-1"}, known_nodes={"worker-1"}))
    assert [c["node"] for c in ok.completions] == ["worker-1"] and ok.errors == []


def test_k8s_node_name_beats_the_node_map_and_the_span_beats_the_resource():
    from app.bridge.spans import resolve_node

    assert resolve_node({"k8s.node.name": "a"}, {"k8s.node.name": "b"}, {}) == ("a", "k8s.node.name")
    assert resolve_node({}, {"k8s.node.name": "b", "host.name": "p"}, {"p": "c"}) == ("b", "k8s.node.name")
    assert resolve_node({"k8s.pod.name": "p"}, {"host.name": "q"}, {"p": "c", "q": "d"}) == ("c", "node_map")


@pytest.mark.parametrize(("change", "expect"), [
    # no k8s.node.name, no map entry, no host.name: malformed, naming what is missing
    (lambda rs: rs["resource"].update(attributes=[a for a in rs["resource"]["attributes"]
                                                  if a["key"] not in ("host.name",)]), "k8s.node.name"),
    # the resource names no app: the root span carries no marker -> not a task
    (lambda rs: rs["resource"].update(attributes=[a for a in rs["resource"]["attributes"]
                                                  if a["key"] != "rtt.app"]), "skipped"),
])
def test_missing_attribute_cases(change, expect):
    doc = copy.deepcopy(OTLP64)
    change(doc["resourceSpans"][0])
    batch = otlp_to_completions(doc)
    if expect == "skipped":
        assert batch.completions == [] and batch.errors == [] and batch.skipped == 2
    else:
        assert batch.completions == [] and expect in str(batch.errors[0])


def test_the_app_on_the_span_beats_the_resource_and_the_resource_beats_the_span_name():
    doc = copy.deepcopy(OTLP64)
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["attributes"].append({"key": "rtt.task_id", "value": {"stringValue": "t-7"}})
    assert otlp_to_completions(doc).completions[0]["app"] == "gCTF"  # not "estimate-ctf"
    span["attributes"].append({"key": "rtt.app", "value": {"stringValue": "Motioncor2"}})
    assert otlp_to_completions(doc).completions[0]["app"] == "Motioncor2"


@pytest.mark.parametrize(("name", "service", "app"), [
    ("POST /upload", "cryoem", "POST-upload"), ("gCTF run", None, "gCTF-run"), ("grpc:Process", None, "grpc-Process"),
    ("上传", "cryoem-runner", "cryoem-runner"), ("  /ctf/estimate.  ", None, "ctf-estimate"),
    ("x" * 70 + "-y", None, "x" * 63), ("gCTF", "cryoem", "gCTF")])
def test_a_span_name_taken_as_the_app_is_made_a_label_value_whose_model_the_registry_stores(name, service, app,
                                                                                            tmp_path):
    c, _ = completion_from_span(span_id="00000000000000ab", name=name, service=service, start_s=100.0, end_s=112.5,
                                attrs={"rtt.task_id": "t-1", "k8s.node.name": "worker-1"}, resource={}, error=False)
    assert c["app"] == app
    sample = sample_value(c, "gpu", None, None, 30.0)  # what the worker makes of it
    assert validate("training-samples", sample) == sample and sample["model_key"] == f"{app}:gpu"
    DirectoryModelStore(tmp_path).save(sample["model_key"], b"blob", fmt="json", features=["a"], params={}, metrics={},
                                       n_samples=1)
    assert DirectoryModelStore(tmp_path).keys() == [f"{app}:gpu"]


def test_a_span_with_no_usable_app_name_is_a_bad_span_and_a_declared_app_is_taken_as_it_is():
    span = {"span_id": "00000000000000ab", "start_s": 100.0, "end_s": 101.0, "resource": {}, "error": False}
    task = {"rtt.task_id": "t-1", "k8s.node.name": "worker-1"}
    with pytest.raises(ContractError) as err:
        completion_from_span(name="上传", service="/", attrs=task, **span)
    assert err.value.reason == "bad_span" and "rtt.app" in str(err.value)
    with pytest.raises(ContractError) as err:  # rtt.app names the app: never rewritten, refused by the contract
        completion_from_span(name="gCTF", service=None, attrs={**task, "rtt.app": "g CTF"}, **span)
    assert err.value.reason == "schema" and "app" in str(err.value)


@pytest.mark.parametrize("doc", [{"data": {}}, {"data": [1]}, {"data": [{"spans": {}}]},
                                 {"data": [{"spans": [], "processes": "p1"}]}])
def test_a_document_that_is_no_query_response_raises(doc):
    with pytest.raises(ContractError) as err:
        jaeger_to_completions(doc)
    assert err.value.reason == "bad_export"


@pytest.mark.parametrize(("field", "value", "detail"), [
    ("spanID", "not-hex", "spanID"), ("startTime", "2026-12-01T10:00:00Z", "microseconds"),
    ("duration", -5, "microseconds"), ("tags", [{"key": "rtt.task_id", "type": "int64", "value": "x"}], "int64"),
])
def test_malformed_query_api_spans_are_errors_of_their_own(field, value, detail):
    doc = copy.deepcopy(QUERY)
    doc["data"][0]["spans"][2][field] = value
    batch = jaeger_to_completions(doc)
    assert len(batch.completions) == 1 and detail in str(batch.errors[0])


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_query_api_decoder_never_crashes(doc):
    for d in ({"data": [doc]}, {"data": [{"spans": [doc], "processes": {"p": doc}}]}):
        try:
            jaeger_to_completions(d)
        except ContractError:
            pass
