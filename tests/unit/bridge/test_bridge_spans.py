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
