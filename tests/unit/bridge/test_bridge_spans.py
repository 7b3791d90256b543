"""Jaeger and OTLP span JSON -> exact task-completions; malformed spans raise ContractError."""

from __future__ import annotations

import copy
import json

import pytest
from bridgekit import SPANS
from hypothesis import given, settings
from hypothesis import strategies as st

from app.bridge.jaeger import jaeger_span_to_completion, jaeger_to_completions
from app.bridge.otlp import otlp_to_completions
from app.bridge.spans import SpanOptions
from app.contracts.codec import validate
from app.errors import ContractError

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


@pytest.mark.parametrize("doc", [[], "x", {"resourceSpans": {}}, {"resourceSpans": [1]}])
def test_a_document_that_is_no_otlp_export_raises(doc):
    with pytest.raises(ContractError):
        otlp_to_completions(doc)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["spanId", "startTime", "duration", "tags", "process", "operationName"]),
                       json_values))
def test_jaeger_decoder_never_crashes(span):
    try:
        jaeger_to_completions(span)
    except ContractError:
        pass


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_otlp_decoder_never_crashes(doc):
    for d in (doc, {"resourceSpans": [{"scopeSpans": [{"spans": [doc]}]}]}):
        try:
            otlp_to_completions(d)
        except ContractError:
            pass


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

    [record] = list(read_records(io.StringIO((SPANS / "jaeger-query-traces.json").read_text())))
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
