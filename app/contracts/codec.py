"""Decode and encode message values against their contract (orjson + compiled JSON Schema).

>>> decode("retrain-events", b'{"model_key":"gCTF:gpu","reason":"drift","cumulative_error":3.1,'
...        b'"threshold":2.0,"ts":1700000000}')["reason"]
'drift'
>>> decode("retrain-events", b'not json')
Traceback (most recent call last):
...
app.errors.ContractError: invalid_json: ...literal...: line 1 column 1 (char 0)
"""

from __future__ import annotations

from typing import Any

import fastjsonschema
import orjson

from app.contracts.loader import contract
from app.errors import ContractError

MAX_MESSAGE_BYTES = 1_048_576


def decode(topic: str, raw: bytes | str | None) -> dict[str, Any]:
    """Parse and validate one message value; :class:`ContractError` with a stable ``reason`` if bad."""
    if raw is None:
        raise ContractError("empty", "message has no value")
    if len(raw) > MAX_MESSAGE_BYTES:
        raise ContractError("too_large", f"{len(raw)} bytes > {MAX_MESSAGE_BYTES}")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ContractError("invalid_json", str(exc)) from None
    return validate(topic, value)


def validate(topic: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ContractError("not_an_object", f"expected a JSON object, got {type(value).__name__}")
    try:
        contract(topic).validator(value)
    except fastjsonschema.JsonSchemaValueException as exc:
        raise ContractError("schema", exc.message) from None
    return value


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
        decode(topic, out)
    return out
