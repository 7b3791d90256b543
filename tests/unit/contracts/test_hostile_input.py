"""Hostile message values: every decoder a consumer uses answers with a ContractError and its reason, never
another exception (a worker whose intake raised anything else would stop, and stop again on the same message
after each restart).

Nesting deeper than Python's stack makes msgspec raise RecursionError (orjson, the reference's parser, reads
up to 1,024 levels and refuses deeper as invalid JSON); a ``str`` with a lone surrogate makes it raise
UnicodeEncodeError. Numbers beyond a double, NaN/Infinity and invalid UTF-8 are refused by both parsers.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from app.contracts import codec, decode, encode, validate
from app.contracts.dead import dead_letter_value
from app.contracts.edge import EdgeDecoder
from app.contracts.loader import TOPIC_NAMES
from app.contracts.unknown import UNKNOWN_FIELDS
from app.errors import ContractError

VALID = {
    "node-metrics": {"node": "n1", "ts": 1, "node_class": "cpu", "metrics": {"cpu_iowait": 0.5}},
    "task-completions": {"task_id": "t1", "app": "gCTF", "node": "n1", "submitted_ts": 0.5, "started_ts": 1.0,
                         "finished_ts": 2.0, "rtt_ms": 1000.0, "status": "ok"},
    "rtt-predictions": {"task_id": "t1", "app": "gCTF", "node": "n1", "ts": 1.0, "predicted_rtt_ms": 5.0,
                        "model_version": 1},
}


def arrays(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def objects(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


# (name, raw, reason): the reason both the reference and the edge decoders give, for every topic
HOSTILE: list[tuple[str, bytes | str, str]] = [
    ("unknown field nested 1,000 deep", b'{"a":' + arrays(1000) + b"}", "schema"),  # orjson reads it: no fields
    ("objects nested 1,000 deep", objects(1000), "schema"),
    ("top-level array nested 1,000 deep", arrays(1000), "not_an_object"),
    ("node nested 1,000 deep", b'{"node":' + arrays(1000) + b"}", "schema"),
    ("metrics nested 1,000 deep", b'{"node":"n1","ts":1,"node_class":"cpu","metrics":' + objects(1000) + b"}",
     "schema"),
    ("unknown field nested 5,000 deep", b'{"a":' + arrays(5000) + b"}", "invalid_json"),  # beyond orjson's limit
    ("objects nested 5,000 deep", objects(5000), "invalid_json"),
    ("unclosed nesting", b'{"a":' + b"[" * 5000, "invalid_json"),
    ("integer beyond a double", b'{"a":' + b"9" * 5000 + b"}", "invalid_json"),
    ("node beyond a double", b'{"node":' + b"9" * 400 + b"}", "invalid_json"),
    ("exponent beyond a double", b'{"ts":1e999999}', "invalid_json"),
    ("NaN", b'{"ts":NaN}', "invalid_json"),
    ("Infinity", b'{"ts":Infinity}', "invalid_json"),
    ("-Infinity", b'{"ts":-Infinity}', "invalid_json"),
    ("invalid UTF-8 in a value", b'{"node":"\xff\xfe"}', "invalid_json"),
    ("invalid UTF-8 in a key", b'{"\xff":1}', "invalid_json"),
    ("lone surrogate in a str", '{"node":"\ud800"}', "invalid_json"),
    ("lone surrogate in a str's key", '{"\ud800":1}', "invalid_json"),
    ("escaped lone surrogate", b'{"node":"\\ud800"}', "invalid_json"),
    ("escaped lone surrogate in a key", b'{"\\udc00":1}', "invalid_json"),
]
IDS = [name for name, _, _ in HOSTILE]

EDGE = {topic: EdgeDecoder(topic) for topic in TOPIC_NAMES}
UNTYPED = {topic: EdgeDecoder(topic, typed=False) for topic in TOPIC_NAMES}  # the number-map and plain paths
DECODERS: dict[str, Callable[[str], Callable[[Any], dict[str, Any]]]] = {
    "decode": lambda topic: lambda raw: decode(topic, raw),
    "decode-strict": lambda topic: lambda raw: decode(topic, raw, strict=True),
    "edge": EDGE.__getitem__,
    "edge-untyped": UNTYPED.__getitem__,
}


def reason_of(fn: Callable[[Any], Any], raw: Any) -> str:
    try:
        fn(raw)
    except ContractError as exc:
        return exc.reason
    raise AssertionError("accepted")


@pytest.mark.parametrize("decoder", sorted(DECODERS))
@pytest.mark.parametrize("topic", TOPIC_NAMES)
@pytest.mark.parametrize(("name", "raw", "reason"), HOSTILE, ids=IDS)
def test_a_hostile_message_is_a_contract_error_with_its_reason(decoder: str, topic: str, name: str,
                                                               raw: bytes | str, reason: str) -> None:
    assert reason_of(DECODERS[decoder](topic), raw) == reason


@pytest.mark.parametrize("topic", TOPIC_NAMES)
def test_the_reason_is_the_reference_decoders_for_deep_nesting_at_every_depth(topic: str) -> None:
    """Around the depth where msgspec runs out of stack and where orjson stops reading."""
    for depth in (900, 950, 990, 1000, 1010, 1020, 1022, 1023, 1024, 1025, 1100, 2000):
        raw = b'{"a":' + arrays(depth) + b"}"
        assert reason_of(EDGE[topic], raw) == reason_of(lambda r: decode(topic, r), raw), depth


@pytest.mark.parametrize("topic", sorted(VALID))
def test_a_valid_message_with_a_deeply_nested_unknown_field_is_accepted_as_the_reference_does(topic: str) -> None:
    """A newer release's field is ignored however it is nested, once orjson reads it; nothing is lost."""
    deep = orjson.dumps(VALID[topic])[:-1] + b',"later":' + arrays(1000) + b"}"
    UNKNOWN_FIELDS.clear()
    try:
        assert EDGE[topic](deep) == UNTYPED[topic](deep) == decode(topic, deep) == VALID[topic]
        assert UNKNOWN_FIELDS.counts() == {(topic, "later"): 3}
        assert reason_of(lambda r: decode(topic, r, strict=True), deep) == "schema"
    finally:
        UNKNOWN_FIELDS.clear()


def test_a_validator_failure_of_another_kind_is_a_schema_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the compiled validator raises on a value it cannot check, the message is refused with a reason."""

    class Boom:
        value_schema = {"type": "object"}

        @staticmethod
        def validator(value: Any) -> None:
            raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(codec, "contract", lambda topic: Boom)
    with pytest.raises(ContractError) as got:
        validate("node-metrics", {"node": "n1"})
    assert got.value.reason == "schema" and "RecursionError" in str(got.value)
    with pytest.raises(ContractError) as got:
        decode("node-metrics", b'{"node":"n1"}')
    assert got.value.reason == "schema" and "RecursionError" in str(got.value)


@pytest.mark.parametrize(("name", "raw", "reason"), [c for c in HOSTILE if isinstance(c[1], bytes)],
                         ids=[name for name, raw, _ in HOSTILE if isinstance(raw, bytes)])
def test_a_hostile_message_makes_a_dead_letter_that_keeps_it(name: str, raw: bytes, reason: str) -> None:
    """Its dead letter, with the decoder's error and reason, passes the dead-letters contract and keeps its bytes."""
    with pytest.raises(ContractError) as got:
        EDGE["task-completions"](raw)
    letter = dead_letter_value("u-task-completions", 0, 7, str(got.value), got.value.reason, raw, "n1", 1.0)
    assert letter["reason"] == reason
    assert decode("dead-letters", encode("dead-letters", letter)) == letter
    kept = base64.b64decode(letter["raw"])
    assert kept == raw[:len(kept)]


def test_a_str_with_a_lone_surrogate_makes_a_dead_letter_that_keeps_its_code_unit() -> None:
    raw = '{"node": "gpu-\udc80"}'
    d = dead_letter_value("t", 0, 7, "schema: x", "schema", raw, None, 0.0)
    assert base64.b64decode(d["raw"]) == raw.encode("utf-8", "surrogatepass")


def test_a_key_given_as_a_str_with_a_lone_surrogate_makes_a_dead_letter_that_can_be_encoded() -> None:
    """Encoding its dead letter raised ``unserialisable`` (UTF-8 cannot encode a lone surrogate): the surrogate is
    kept as its escape, the rest of the key as it was."""
    d = dead_letter_value("t", 0, 7, "schema: x", "schema", "x\ud800", "k\ud800", 0.0)
    assert decode("dead-letters", encode("dead-letters", d)) == d
    assert d["key"] == "k\\ud800" and d["error"] == "schema: x"
    long = "gpu-\udc80" * 100  # 500 characters: cut to 256, then escaped
    d = dead_letter_value("t", 0, 7, "schema: \udc80", "schema", b"{", long, 0.0)
    assert decode("dead-letters", encode("dead-letters", d)) == d
    assert d["key"] == long[:256].encode("utf-8", "backslashreplace").decode()
    assert d["error"] == "schema: \\udc80; key cut to its first 256 characters (of 500 characters)"
