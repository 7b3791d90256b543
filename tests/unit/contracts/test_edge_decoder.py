"""The fast edge decoder accepts and rejects exactly what the contract's own decoder does."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.contracts import decode
from app.contracts.edge import EdgeDecoder
from app.errors import ContractError

DECODER = EdgeDecoder("node-metrics")

number = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2**62), 2**62), st.booleans())
anything = st.one_of(number, st.text(max_size=3), st.none(), st.lists(st.integers(-5, 5), max_size=2))
metric_name = st.one_of(st.text(min_size=1, max_size=12), st.just("x" * 201))
metrics = st.one_of(st.dictionaries(metric_name, number, max_size=6),
                    st.dictionaries(metric_name, anything, max_size=3), anything)
value = st.fixed_dictionaries(
    {},
    optional={
        "node": st.one_of(st.text(max_size=5), anything), "ts": st.one_of(st.floats(-1, 2e11), anything),
        "node_class": st.sampled_from(["cpu", "gpu", "tpu"]), "gpu_model": st.one_of(st.none(), st.text(max_size=4)),
        "metrics": metrics, "stale": st.lists(st.sampled_from(["gpu", "cpu", "disk"]), max_size=2),
        "extra": st.integers(),
    },
)


def outcome(fn, raw: bytes):  # type: ignore[no-untyped-def]
    try:
        return ("ok", fn(raw))
    except ContractError as exc:
        return ("error", exc.reason, str(exc))


@settings(max_examples=400, deadline=None)
@given(v=value)
def test_agrees_with_contract_decoder(v: dict) -> None:
    raw = json.dumps(v).encode()
    assert outcome(DECODER, raw) == outcome(lambda r: decode("node-metrics", r), raw)


@pytest.mark.parametrize("raw", [b"", b"\x00\xff", b"[1]", b"NaN", b'{"node":"a","ts":1,"node_class":"cpu",'
                                 b'"metrics":{"m":NaN}}', None])
def test_bad_bytes_raise_the_contract_reason(raw: bytes | None) -> None:
    with pytest.raises(ContractError) as got:
        DECODER(raw)
    with pytest.raises(ContractError) as want:
        decode("node-metrics", raw)
    assert got.value.reason == want.value.reason


def test_each_path_decodes_a_valid_message() -> None:
    """dead-letters (no number map) and node-metrics are typed; model-updates without the typed pass checks
    its number maps in C and the rest with the contract's validator."""
    d = EdgeDecoder("dead-letters")
    assert (d.mode, DECODER.mode, EdgeDecoder("model-updates", typed=False).mode) == ("typed", "typed", "maps")
    assert d(b'{"topic":"t","partition":0,"offset":1,"error":"e","raw":"","ts":1}')["topic"] == "t"
