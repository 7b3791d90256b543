"""Fields a contract does not declare (a newer release's): ignored by every consumer, never written by us.

Values are generated from every contract (``test_edge_typed.value``), valid and broken, and given fields
no contract declares at every level that declares its properties: the value decoded is the one without them,
a broken value is refused with the same reason and error as without them, and what the project writes
(``encode``, ``validate``, ``decode(..., strict=True)``) still refuses them.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from test_edge_typed import value

from app.contracts import decode, encode, validate
from app.contracts.edge import EdgeDecoder
from app.contracts.loader import TOPIC_NAMES, contract
from app.contracts.unknown import OTHER, UNKNOWN_FIELDS, UnknownFields, register_unknown_fields
from app.errors import ContractError

INT64 = st.integers(-(2**63), 2**63 - 1)
NEW = st.one_of(st.none(), st.booleans(), INT64, st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=5),
                st.lists(INT64, max_size=2), st.dictionaries(st.text(max_size=3), INT64, max_size=2))
NAMES = st.sampled_from(["p99_ms", "zone", "added_later", "_x", "Node", "a.b", "é"])


@pytest.fixture(autouse=True)
def _fresh_counts() -> Iterator[None]:
    UNKNOWN_FIELDS.clear()
    yield
    UNKNOWN_FIELDS.clear()


def with_unknown(data: st.DataObject, schema: dict[str, Any], v: Any, nested: bool) -> Any:
    """``v`` with a field its schema does not declare in every object that declares its properties (only the
    top one unless ``nested``), a map's values and array items included."""
    if isinstance(v, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties", True)
        out = {}
        for k, item in v.items():
            sub = props.get(k) if isinstance(props, dict) and k in props else extra if isinstance(extra, dict) else None
            out[k] = with_unknown(data, sub, item, True) if nested and sub is not None else item
        if isinstance(props, dict) and extra is False:
            name = data.draw(NAMES.filter(lambda n: n not in props))
            out[name] = data.draw(NEW)
        return out
    if isinstance(v, list) and nested and isinstance(schema.get("items"), dict):
        return [with_unknown(data, schema["items"], item, True) for item in v]
    return v


def outcome(fn: Any, raw: bytes) -> tuple[Any, ...]:
    try:
        return ("ok", orjson.dumps(fn(raw), option=orjson.OPT_SORT_KEYS))  # kinds count: 1 is not 1.0
    except ContractError as exc:
        return ("error", exc.reason, str(exc))


@pytest.mark.parametrize("topic", TOPIC_NAMES)
@settings(max_examples=40)
@given(data=st.data())
def test_a_message_with_unknown_fields_decodes_to_the_value_without_them(topic: str, data: st.DataObject) -> None:
    schema = contract(topic).value_schema
    v = value(data, schema)
    raw, extended = json.dumps(v).encode(), json.dumps(with_unknown(data, schema, v, data.draw(st.booleans()))).encode()
    assert extended != raw
    want = outcome(lambda r: decode(topic, r), raw)
    assume(want[0] == "ok")  # the generator aims at valid values, and nearly always hits
    for decoder in (lambda r: decode(topic, r), EdgeDecoder(topic), EdgeDecoder(topic, typed=False)):
        assert outcome(decoder, extended) == want
    assert UNKNOWN_FIELDS.counts()


@pytest.mark.parametrize("topic", TOPIC_NAMES)
@settings(max_examples=40)
@given(data=st.data())
def test_unknown_fields_never_change_what_is_refused_nor_why(topic: str, data: st.DataObject) -> None:
    """A value broken in one place (a bound, a kind, a pattern, a missing field, a map's key or value) is refused
    with the same reason and error whatever unknown fields it carries."""
    schema = contract(topic).value_schema
    v = value(data, schema, wrong=True)
    if not isinstance(v, dict):
        return
    raw, extended = json.dumps(v).encode(), json.dumps(with_unknown(data, schema, v, data.draw(st.booleans()))).encode()
    want = outcome(lambda r: decode(topic, r), raw)
    assert outcome(lambda r: decode(topic, r), extended) == want
    assert outcome(EdgeDecoder(topic), extended) == want


WEIGHTS = {"node": "n1", "ts": 1.0, "weight": 0.5, "predicted_rtt_ms": {"gCTF": 5.0}, "stale": False}


@pytest.mark.parametrize(("broken", "error"), [
    ({k: v for k, v in WEIGHTS.items() if k != "weight"}, "data must contain ['weight'] properties"),
    ({**WEIGHTS, "weight": "high"}, "data.weight must be number"),
    ({**WEIGHTS, "weight": 1.5}, "data.weight must be smaller than or equal to 1"),
    ({**WEIGHTS, "node_class": "tpu"}, "data.node_class must be one of ['cpu', 'gpu']"),
    ({**WEIGHTS, "predicted_rtt_ms": {"": 5.0}}, "data.predicted_rtt_ms must be named by propertyName definition"),
    ({**WEIGHTS, "predicted_rtt_ms": {"g CTF": 5.0}}, "data.predicted_rtt_ms must be named by propertyName definition"),
    ({**WEIGHTS, "samples": {"gCTF": -1}}, "data.samples.gCTF must be bigger than or equal to 0"),
])
def test_an_unknown_field_does_not_hide_a_violation(broken: dict[str, Any], error: str) -> None:
    raw = orjson.dumps({**broken, "p99_ms": 7.0})
    for decoder in (lambda r: decode("node-weights", r), EdgeDecoder("node-weights")):
        with pytest.raises(ContractError) as info:
            decoder(raw)
        assert info.value.reason == "schema" and str(info.value).startswith(f"schema: {error}"), str(info.value)
    assert UNKNOWN_FIELDS.counts() == {}  # refused: nothing was ignored


@pytest.mark.parametrize("field", [b'"\xff"', b'"\\ud800"', b"1e400", b"NaN", b"[1,", b'"a\x01"'])
def test_an_unknown_field_that_is_not_json_is_refused_as_the_reference_refuses_it(field: bytes) -> None:
    """The edge decoder reads a message with unknown fields with ``orjson``, as the reference does: invalid
    JSON inside a field it is about to ignore is still ``invalid_json``."""
    raw = orjson.dumps(WEIGHTS)[:-1] + b',"zone":' + field + b"}"
    want = outcome(lambda r: decode("node-weights", r), raw)
    assert want[:2] == ("error", "invalid_json")
    assert outcome(EdgeDecoder("node-weights"), raw) == want
    assert UNKNOWN_FIELDS.counts() == {}


def test_an_unknown_key_inside_a_nested_object_is_dropped_and_named_by_its_path() -> None:
    """prediction-errors' per-app statistics are objects of their own: a key they do not declare is dropped
    there; the app names around them stay data (a map, checked as before)."""
    errors = {"node": "n1", "ts": 1.0, "period_s": 60.0,
              "apps": {"gCTF": {"n": 3, "rmse_ms": 1.0, "mae_ms": 1.0, "mape": 0.1, "bias_ms": 0.0,
                                "cumulative": 2.0, "p99_ms": 9.0}}}
    raw = orjson.dumps(errors)
    for decoder in (lambda r: decode("prediction-errors", r), EdgeDecoder("prediction-errors")):
        got = decoder(raw)
        assert got["apps"] == {"gCTF": {k: v for k, v in errors["apps"]["gCTF"].items() if k != "p99_ms"}}
    assert UNKNOWN_FIELDS.counts() == {("prediction-errors", "apps.*.p99_ms"): 2}
    bad = copy.deepcopy(errors)
    bad["apps"]["g CTF"] = bad["apps"].pop("gCTF")
    with pytest.raises(ContractError, match="data.apps must be named by propertyName definition"):
        decode("prediction-errors", orjson.dumps(bad))


def test_an_unknown_field_is_logged_once_and_counted_each_time(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    register_unknown_fields(registry)
    register_unknown_fields(registry)  # a second time is a no-op, not a duplicate series
    edge = EdgeDecoder("node-weights")
    with caplog.at_level(logging.WARNING, logger="app.contracts.unknown"):
        for i in range(3):
            assert edge(orjson.dumps({**WEIGHTS, "ts": float(i), "zone": "a"})) == {**WEIGHTS, "ts": float(i)}
        decode("node-features", orjson.dumps({"node": "n1", "ts": 1.0, "node_class": "cpu", "window_s": 30.0,
                                              "count": 1, "features": {}, "zone": "a"}))
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert len(said) == 2 and all(level == logging.WARNING for level, _ in said), said
    assert said[0][1].startswith("node-weights: field 'zone' is not in the contract")
    assert said[1][1].startswith("node-features: field 'zone' is not in the contract")
    sample = registry.get_sample_value
    assert sample("rtt_contract_unknown_fields_total", {"topic": "node-weights", "field": "zone"}) == 3
    assert sample("rtt_contract_unknown_fields_total", {"topic": "node-features", "field": "zone"}) == 1


def test_the_worker_and_extender_serve_the_count() -> None:
    from app.extender.metrics import ExtenderMetrics
    from app.streams.metrics import WorkerMetrics

    decode("node-weights", orjson.dumps({**WEIGHTS, "zone": "a"}))
    worker, extender = WorkerMetrics(), ExtenderMetrics()
    assert worker.value("rtt_contract_unknown_fields_total", topic="node-weights", field="zone") == 1
    assert b'rtt_contract_unknown_fields_total{field="zone",topic="node-weights"} 1.0' in extender.render()


def test_the_names_remembered_are_capped(caplog: pytest.LogCaptureFixture) -> None:
    fields = UnknownFields(max_names=2)
    with caplog.at_level(logging.WARNING, logger="app.contracts.unknown"):
        fields.note("node-weights", ["a", "b", "c", "x" * 500])
        fields.note("node-weights", ["a", "d"])
        fields.note("node-features", ["e"])
    assert fields.counts() == {("node-weights", "a"): 2, ("node-weights", "b"): 1, ("node-weights", OTHER): 3,
                               ("node-features", OTHER): 1}
    assert len(caplog.records) == 4  # a, b, and once per topic: the rest unnamed
    with pytest.raises(ValueError, match="max_names must be >= 0"):
        UnknownFields(max_names=-1)


def test_a_long_name_is_cut() -> None:
    fields = UnknownFields()
    fields.note("node-weights", ["x" * 500])
    assert fields.counts() == {("node-weights", "x" * 64): 1}


@pytest.mark.parametrize("topic", TOPIC_NAMES)
@settings(max_examples=15)
@given(data=st.data())
def test_what_the_project_writes_declares_every_field(topic: str, data: st.DataObject) -> None:
    """``encode``, ``validate`` and ``decode(..., strict=True)`` (what producers and the tests of what they
    produce use) refuse a field the contract does not declare."""
    schema = contract(topic).value_schema
    v = value(data, schema)
    assume(outcome(lambda r: decode(topic, r, strict=True), json.dumps(v).encode())[0] == "ok")
    extended = with_unknown(data, schema, v, nested=False)
    with pytest.raises(ContractError, match="must not contain"):
        encode(topic, extended)
    with pytest.raises(ContractError, match="must not contain"):
        validate(topic, extended)
    with pytest.raises(ContractError, match="must not contain"):
        decode(topic, json.dumps(extended).encode(), strict=True)
    assert UNKNOWN_FIELDS.counts() == {}
