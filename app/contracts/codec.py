"""Decode and encode message values against their contract (orjson + compiled JSON Schema).

What a consumer reads (:func:`decode`) may carry fields its contract does not declare, added by a newer
release: they are dropped, counted and logged (:mod:`app.contracts.unknown`) and the rest is checked as
strictly as ever. What this project writes (:func:`encode`, :func:`validate`, ``decode(..., strict=True)``)
declares every field: an unknown one is refused there.

>>> decode("retrain-events", b'{"model_key":"gCTF:gpu","reason":"drift","cumulative_error":3.1,'
...        b'"threshold":2.0,"ts":1700000000}')["reason"]
'drift'
>>> raw = b'{"model_key":"gCTF:gpu","reason":"drift","cumulative_error":3.1,"threshold":2.0,"ts":1,"lag_s":4}'
>>> "lag_s" in decode("retrain-events", raw)
False
>>> decode("retrain-events", raw, strict=True)
Traceback (most recent call last):
...
app.errors.ContractError: schema: data must not contain {'lag_s'} properties
>>> decode("retrain-events", b'not json')
Traceback (most recent call last):
...
app.errors.ContractError: invalid_json: ...literal...: line 1 column 1 (char 0)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import fastjsonschema
import orjson

from app.contracts.loader import NameRule, contract
from app.contracts.unknown import UNKNOWN_FIELDS, drop_unknown
from app.errors import ContractError

MAX_MESSAGE_BYTES = 1_048_576


def decode(topic: str, raw: bytes | str | None, *, strict: bool = False) -> dict[str, Any]:
    """Parse and validate one consumed message value; :class:`ContractError` with a stable ``reason`` if bad,
    whatever the value (never another exception: its consumer sends it to dead letters and goes on).

    Fields the contract does not declare are dropped from the value (see the module); with ``strict`` they
    are refused, as in what this project writes.
    """
    if raw is None:
        raise ContractError("empty", "message has no value")
    if len(raw) > MAX_MESSAGE_BYTES:
        raise ContractError("too_large", f"{len(raw)} bytes > {MAX_MESSAGE_BYTES}")
    try:
        value = orjson.loads(raw)
    except Exception as exc:  # orjson.JSONDecodeError: nesting beyond 1,024, a number beyond a double, NaN, ...
        raise ContractError("invalid_json", str(exc)) from None
    try:
        return validate(topic, value)
    except ContractError as exc:
        if strict or exc.reason != "schema":
            raise
        try:
            dropped = drop_unknown(contract(topic).value_schema, value)
        except Exception:  # a value it cannot walk: refused for the violation found
            raise exc from None
        if not dropped:
            raise
    accepted = validate(topic, value)  # what the contract knows, as strictly as ever: the real violation if any
    UNKNOWN_FIELDS.note(topic, dropped)
    return accepted


def validate(topic: str, value: Any) -> dict[str, Any]:
    """Check ``value`` against ``topic``'s contract, every field declared (what this project writes)."""
    if not isinstance(value, dict):
        raise ContractError("not_an_object", f"expected a JSON object, got {type(value).__name__}")
    check = contract(topic).validator
    try:
        check(value)
    except fastjsonschema.JsonSchemaValueException as exc:
        raise ContractError("schema", _message(exc)) from None
    except Exception as exc:  # a value the validator cannot check (RecursionError, ...) is refused too
        raise ContractError("schema", f"{type(exc).__name__}: {exc}") from None
    return value


def _message(exc: fastjsonschema.JsonSchemaValueException) -> str:
    """The validator's message, naming what it leaves out: the first key of a map that breaks the rule of its
    names (shown cut, control characters escaped) and the rule's description, or how many keys a map has.

    >>> _message(fastjsonschema.JsonSchemaValueException("data.m must be named by propertyName definition",
    ...          {"ok": 1, "a[0]": 2}, "data.m", rule="propertyNames",
    ...          definition={"propertyNames": {"pattern": "^[a-z]+$", "description": "letters"}}))
    "data.m must be named by propertyName definition: 'a[0]' is not letters"
    >>> _message(fastjsonschema.JsonSchemaValueException("data.m must contain less than or equal to 1 properties",
    ...          {"a": 1, "b": 2}, "data.m", rule="maxProperties", definition={"maxProperties": 1}))
    'data.m must contain less than or equal to 1 properties (it has 2)'
    """
    value, rule, definition = exc.value, exc.rule, exc.rule_definition
    if rule == "maxProperties" and isinstance(value, dict):
        return f"{exc.message} (it has {len(value):,})"
    if rule == "propertyNames" and isinstance(value, dict) and isinstance(definition, dict):
        try:
            names = _names_check(orjson.dumps(definition).decode())
            bad = next((k for k in value if not names(k)), None)
        except Exception:  # naming it is a courtesy: the validator's own message is still the answer
            bad = None
        if bad is not None:
            return f"{exc.message}: {shown_name(bad)} is not {definition.get('description') or 'a name it takes'}"
    return str(exc.message)


def shown_name(name: object, limit: int = 80) -> str:
    """``name`` for an error message: its ``repr`` (control characters escaped), cut past ``limit`` characters.

    >>> shown_name("a\\nb"), shown_name("[" * 100, limit=3)
    ("'a\\\\nb'", "'[[[' (cut; 100 characters)")
    """
    if isinstance(name, str) and len(name) > limit:
        return f"{name[:limit]!r} (cut; {len(name):,} characters)"
    return repr(name)


@functools.lru_cache(maxsize=32)
def _names_check(definition: str) -> Callable[[str], bool]:
    """Whether a key satisfies a map's ``propertyNames`` rule (given as JSON: a cache key)."""
    return NameRule(orjson.loads(definition)).ok


def encode(topic: str, value: dict[str, Any], *, check: bool = True) -> bytes:
    """Serialise a value for ``topic``; with ``check`` the contract is enforced on the way out too, on the bytes
    a consumer will read (a NaN passes a schema's bounds but is written as ``null``).

    >>> encode("dead-letters", {"topic": "t", "partition": 0, "offset": 0, "error": "e", "reason": "r",
    ...                         "raw": "", "key": None, "ts": float("nan")})
    Traceback (most recent call last):
    ...
    app.errors.ContractError: schema: data.ts must be number
    """
    if not isinstance(value, dict):
        raise ContractError("not_an_object", f"expected a JSON object, got {type(value).__name__}")
    try:
        out = orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as exc:
        raise ContractError("unserialisable", str(exc)) from None
    if check:
        decode(topic, out, strict=True)
    return out
