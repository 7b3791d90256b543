"""The typed edge decoder: for every contract, the same values and errors as the contract's own decoder.

Values are generated from each contract's schema, valid and not: every field at and past its bounds, of
the wrong kind, missing or unknown (not an error: ignored, as a newer release's field); integers as floats and
beyond 64 bits; strings of multi-byte characters around their length limits. A value is compared with its
kinds (``1`` is not ``1.0``).
"""

from __future__ import annotations

import functools
import json
from typing import Any

import fastjsonschema
import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.contracts import decode
from app.contracts.edge import EdgeDecoder, typed_decoder
from app.contracts.loader import NAMES_REMEMBERED, TOPIC_NAMES, SchemaValidator, contract
from app.errors import ContractError

WRONG = st.one_of(st.none(), st.booleans(), st.text(max_size=3), st.lists(st.integers(-2, 2), max_size=2),
                  st.dictionaries(st.text(max_size=2), st.integers(), max_size=2), st.integers(-5, 5),
                  st.floats(allow_nan=False, allow_infinity=False), st.integers(2**62, 2**66))
CHARS = st.sampled_from("aé€😀_-.")


def bounds(schema: dict[str, Any]) -> list[float]:
    return [b for b in (schema.get(k) for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"))
            if b is not None]


def number(data: st.DataObject, schema: dict[str, Any], integer: bool, inside: bool) -> Any:
    """A number of the schema (``inside``) or one just past a bound, beyond 64 bits or of the other kind."""
    near = [b + d for b in bounds(schema) for d in (-1, -1e-9, 0, 1e-9, 1)] or [0.0]
    lo = max([schema.get("minimum", -1e18), (schema.get("exclusiveMinimum") or -1e18) + 1e-6])
    hi = min([schema.get("maximum", 1e18), (schema.get("exclusiveMaximum") or 1e18) - 1e-6])
    for _ in range(4):
        v = data.draw(st.one_of(st.sampled_from(near), st.sampled_from(near).map(int), st.integers(-(2**66), 2**66),
                                st.floats(lo, hi), st.integers(int(max(lo, -(2**63))), int(min(hi, 2**63)))))
        v = float(v) if integer and isinstance(v, float) and not inside else v
        ok = lo <= v <= hi and (not integer or isinstance(v, int))
        if ok == inside:
            return v
    if not inside and data.draw(st.booleans()):  # beyond 64 bits: orjson reads a float
        return data.draw(st.integers(2**64, 2**70) | st.integers(-(2**70), -(2**63) - 1))
    return data.draw(WRONG) if not inside else (0 if integer else 0.0) if lo <= 0 <= hi else int(lo) + 1


def string(data: st.DataObject, schema: dict[str, Any], inside: bool) -> str:
    pattern = schema.get("pattern")
    if pattern is not None:
        return patterned(data, pattern, schema.get("minLength", 0), schema.get("maxLength", 1 << 30), inside)
    lo, hi = schema.get("minLength", 0), schema.get("maxLength", 12)
    n = data.draw(st.sampled_from([lo, hi, (lo + hi) // 2] if inside else [n for n in (lo - 1, hi + 1) if n >= 0]))
    return data.draw(st.text(CHARS, min_size=n, max_size=n))


def patterned(data: st.DataObject, pattern: str, lo: int, hi: int, inside: bool) -> str:
    """A string of ``pattern`` within the lengths, or one that breaks one rule: too long, a character the pattern
    refuses, a final newline (which Python's ``$`` would let through), or any text."""
    ok = data.draw(st.from_regex(pattern, fullmatch=True).filter(lambda v: lo <= len(v) <= hi))
    if inside:
        return ok
    how = data.draw(st.sampled_from(["long", "char", "newline", "text"]))
    if how == "long" and hi < 1 << 30:
        return ok + ok[-1] * (hi + 1 - len(ok))
    if how == "char":
        i = data.draw(st.integers(0, len(ok)))
        return ok[:i] + data.draw(st.sampled_from(" |%:/é😀")) + ok[i:]
    if how == "newline":
        return ok + "\n"
    return data.draw(st.text(CHARS, max_size=min(hi + 1, 80)))


def value(data: st.DataObject, schema: dict[str, Any], wrong: bool = False) -> Any:
    """A value ``schema`` accepts, or with ``wrong`` one that breaks exactly one of its rules (somewhere below)."""
    if "enum" in schema:
        return data.draw(st.one_of(WRONG, st.text(CHARS, max_size=3)) if wrong else st.sampled_from(schema["enum"]))
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    kind = data.draw(st.sampled_from(kinds))
    if wrong and kind not in ("object", "array") and data.draw(st.booleans()):
        other = data.draw(WRONG)
        if not any(_is(other, k) for k in kinds):
            return other
    if kind == "null" or kind == "boolean":
        return None if kind == "null" else data.draw(st.booleans())
    if kind == "string":
        return string(data, schema, not wrong)
    if kind in ("number", "integer"):
        return number(data, schema, kind == "integer", not wrong)
    if kind == "array":
        items = [value(data, schema.get("items", {})) for _ in range(data.draw(st.integers(0, 3)))]
        if wrong:
            items.append(value(data, schema.get("items", {}), wrong=True) if "items" in schema else data.draw(WRONG))
        return items
    return obj(data, schema, wrong)


def _is(v: Any, kind: str) -> bool:
    return {"null": v is None, "boolean": isinstance(v, bool), "string": isinstance(v, str),
            "number": isinstance(v, (int, float)) and not isinstance(v, bool),
            "integer": isinstance(v, int) and not isinstance(v, bool), "array": isinstance(v, list),
            "object": isinstance(v, dict)}.get(kind, False)


def obj(data: st.DataObject, schema: dict[str, Any], wrong: bool) -> dict[str, Any]:
    props = schema.get("properties")
    if props is None:  # a map
        names, extra = schema.get("propertyNames", {}), schema.get("additionalProperties", True)
        out = {string(data, names, True): value(data, extra) if isinstance(extra, dict) else data.draw(WRONG)
               for _ in range(data.draw(st.integers(0, 3)))}
        if wrong:
            hows = (["key"] if names else []) + (["value"] if isinstance(extra, dict) else []) + (
                ["many"] if "maxProperties" in schema else [])
            if not hows:  # any key, any value: only not being an object breaks it
                return data.draw(WRONG)  # type: ignore[no-any-return]
            how = data.draw(st.sampled_from(hows))
            if how == "many":  # one key more than the map may have (keys of the names' rule)
                return {f"k{i}": value(data, extra) if i < 3 and isinstance(extra, dict) else 0.5
                        for i in range(schema["maxProperties"] + 1)}
            out[string(data, names, how != "key")] = value(data, extra, wrong=how == "value")
        elif "maxProperties" in schema and data.draw(st.booleans()):  # as many keys as it may have
            return {f"k{i}": value(data, extra) if i < 3 and isinstance(extra, dict) else 0.5
                    for i in range(schema["maxProperties"])}
        return out
    required = set(schema.get("required", ()))
    out = {k: value(data, v) for k, v in props.items() if k in required or data.draw(st.booleans())}
    if wrong:
        how = data.draw(st.sampled_from(["field", "missing", "unknown"] if required else ["field", "unknown"]))
        if how == "field":
            k = data.draw(st.sampled_from(sorted(props)))
            out[k] = value(data, props[k], wrong=True)
        elif how == "missing":
            del out[data.draw(st.sampled_from(sorted(required)))]
        else:  # valid since unknown fields are ignored (test_unknown_fields.py): the decoders still agree
            out["unknown_field"] = 1
    return out


def outcome(fn: Any, raw: bytes) -> tuple[Any, ...]:
    try:
        return ("ok", orjson.dumps(fn(raw), option=orjson.OPT_SORT_KEYS))  # kinds count: 1 is not 1.0
    except ContractError as exc:
        return ("error", exc.reason, str(exc))


TYPED = [t for t in TOPIC_NAMES if EdgeDecoder(t).mode == "typed"]


@pytest.mark.parametrize("topic", TOPIC_NAMES)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_every_contract_agrees_with_its_reference_decoder(topic: str, data: st.DataObject) -> None:
    v = value(data, contract(topic).value_schema, wrong=data.draw(st.booleans()))
    raw = json.dumps(v, ensure_ascii=data.draw(st.booleans())).encode()
    assert outcome(EdgeDecoder(topic), raw) == outcome(lambda r: decode(topic, r), raw)


RAW = [b'{"node":"a","node":"b"}', b'{"ts":1e400}', b'{"ts":-0}', b'{"ts":-0.0}', b"[]", b"1", b'"x"', b"null",
       b'{"count":1.0}', b'{"count":18446744073709551615}', b'{"count":9223372036854775808}',
       b'{"count":18446744073709551616}', b'{"count":-9223372036854775809}', b'{"ts":1e5}', b"{", b"",
       b'{"node":"\\u00e9\\ud83d\\ude00"}', b'{"node":"\\ud800"}', b"\xff", b'{"a":NaN}', b' {} ']


@pytest.mark.parametrize("topic", TYPED)
@pytest.mark.parametrize("edge", RAW)
def test_raw_edge_cases_agree(topic: str, edge: bytes) -> None:
    """Duplicate keys, numbers beyond float and 64-bit ranges, -0, lone surrogates, bad bytes, non-objects,
    spliced into a valid message of the topic where they are fields."""
    assert outcome(EdgeDecoder(topic), edge) == outcome(lambda r: decode(topic, r), edge)
    valid = VALID.get(topic)
    if valid is not None and edge.startswith(b'{"') and edge.endswith(b"}"):
        spliced = valid[:-1] + b"," + edge[1:]  # the edge's fields after the valid ones: the later key wins
        assert outcome(EdgeDecoder(topic), spliced) == outcome(lambda r: decode(topic, r), spliced)


VALID = {
    "node-metrics": b'{"node":"n","ts":1,"node_class":"gpu","metrics":{"m":1,"k":2.5}}',
    "node-features": b'{"node":"n","ts":1.5,"node_class":"cpu","window_s":30,"count":3,"features":{"a__mean":1}}',
    "task-completions": b'{"task_id":"t","app":"gCTF","node":"n","submitted_ts":1,"started_ts":2,"finished_ts":3,'
                        b'"rtt_ms":2000,"status":"ok"}',
}


def test_shipped_contracts_are_all_decoded_typed() -> None:
    """The typed subset covers every shipped contract, patterns included; without it model-updates checks its
    number maps in C."""
    assert set(TYPED) == set(TOPIC_NAMES)
    assert typed_decoder(contract("model-updates").value_schema) is not None
    assert EdgeDecoder("model-updates", typed=False).mode == "maps"


@pytest.mark.parametrize("raw", [b'"gCTF"', b'"gCTF\\n"', b'"\\ngCTF"', b'"g CTF"', b'"-gCTF"', b'"gCTF."', b'"a"',
                                 b'"g\\u00e9"', b'"POST /upload"'])
def test_a_pattern_is_matched_as_the_contract_validator_matches_it(raw: bytes) -> None:
    """``$`` is the end of the string (not before a final newline), as in the contract's validator."""
    schema = contract("task-completions").value_schema["properties"]["app"]
    typed = typed_decoder(schema)
    assert typed is not None
    try:
        typed.decode(raw)
        got = True
    except msgspec.ValidationError:  # refused; any other error (a crash of the decoder) fails the test
        got = False
    try:
        fastjsonschema.compile(schema)(orjson.loads(raw))
        want = True
    except fastjsonschema.JsonSchemaValueException:
        want = False
    assert got == want
    assert got == (raw in (b'"gCTF"', b'"a"'))


def test_a_valid_value_keeps_its_number_kinds_and_fields() -> None:
    d = EdgeDecoder("node-features")
    got = d(VALID["node-features"])
    assert got == decode("node-features", VALID["node-features"])
    assert type(got["ts"]) is float and type(got["count"]) is int and type(got["features"]["a__mean"]) is int
    assert "stale" not in got and "gpu_model" not in got  # absent fields stay absent


def schema_outcome(check: Any, v: Any) -> tuple[Any, ...]:
    try:
        check(v)
    except fastjsonschema.JsonSchemaValueException as exc:
        return ("error", exc.message, exc.rule, exc.name)
    return ("ok",)


@functools.cache
def compiled(topic: str) -> Any:
    return fastjsonschema.compile(contract(topic).value_schema)


@pytest.mark.parametrize("topic", [t for t in TOPIC_NAMES if SchemaValidator(contract(t).value_schema).rules])
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_every_contracts_validator_answers_as_its_schemas_own_code(topic: str, data: st.DataObject) -> None:
    """The contract's validator checks the names of its maps against those found valid before
    (:class:`app.contracts.loader.SchemaValidator`, one per process: the names of earlier examples are remembered):
    the same answers and errors as the schema compiled as it is."""
    v = value(data, contract(topic).value_schema, wrong=data.draw(st.booleans()))
    assert schema_outcome(contract(topic).validator, v) == schema_outcome(compiled(topic), v)


def test_the_names_a_map_remembers_are_bounded_and_a_bad_one_is_still_refused() -> None:
    check = SchemaValidator(contract("training-samples").value_schema)
    base = json.loads(VALID_SAMPLE)
    for i in range(0, 20_000, 1_000):
        check({**base, "features": {f"m{j}": 1.0 for j in range(i, i + 1_000)}})
    assert len(check.rules["features"]._known) == NAMES_REMEMBERED
    for bad in ("m1[0]", "m1\n", ""):
        v = {**base, "features": {"m1": 1.0, bad: 1.0}}
        assert schema_outcome(check, v)[0] == "error" and schema_outcome(check, v) == schema_outcome(
            compiled("training-samples"), v)


VALID_SAMPLE = ('{"model_key":"gCTF:gpu","task_id":"t","app":"gCTF","node":"n","node_class":"gpu","started_ts":1,'
                '"rtt_ms":2,"features":{"a__mean":1}}')


RULED = [t for t in TOPIC_NAMES if SchemaValidator(contract(t).value_schema).rules]


@pytest.mark.parametrize("topic", RULED)
def test_the_names_of_a_ruled_map_are_checked_after_decoding_by_the_validators_rule(topic: str) -> None:
    """msgspec runs a key's pattern in Python for every key (a 30-key map: 22.6 µs instead of 4.1 µs): a map whose
    names the contract's validator checks by a remembered rule is decoded with plain string keys, and its names
    are checked by that same rule (one remembered set, shared with the validator)."""
    d = EdgeDecoder(topic)
    fields = {f.name: f.type for f in msgspec.inspect.type_info(d._typed.type).fields}  # type: ignore[union-attr]
    rules = contract(topic).validator.rules  # type: ignore[attr-defined]
    assert rules
    for prop in rules:
        assert fields[prop].key_type == msgspec.inspect.StrType()  # no pattern, no lengths: checked after


@pytest.mark.parametrize("typed", [True, False])
@pytest.mark.parametrize("extra", [b"", b',"unknown_field":1'])
@pytest.mark.parametrize("bad", ["gpu_util[0]", "a<b", "m\n", "", "x" * 195, "0lead", "\u00e9"])
def test_a_bad_name_after_remembered_ones_is_refused_as_the_reference_refuses_it(typed: bool, extra: bytes,
                                                                                   bad: str) -> None:
    """Names found valid before are remembered; a bad one among them is still refused, with the reference's error,
    on the typed path, its pass that ignores unknown fields, and the number-map path."""
    d = EdgeDecoder("node-metrics", typed=typed)
    names = [f"metric_{i}" for i in range(40)]
    good = orjson.dumps({"node": "n", "ts": 1, "node_class": "gpu", "metrics": dict.fromkeys(names, 1.5)})
    assert d(good)["metrics"] == dict.fromkeys(names, 1.5)
    assert set(names) <= contract("node-metrics").validator.rules["metrics"]._known  # type: ignore[attr-defined]
    raw = orjson.dumps({"node": "n", "ts": 1, "node_class": "gpu",
                        "metrics": {**dict.fromkeys(names, 1.5), bad: 2.0}})[:-1] + extra + b"}"
    assert outcome(d, raw) == outcome(lambda r: decode("node-metrics", r), raw)
    assert outcome(d, raw)[:2] == ("error", "schema")
