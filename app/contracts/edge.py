"""Validation at the edge: decode one message and check it against its topic's contract, fast.

:func:`app.contracts.decode` is the reference: ``orjson`` then the contract's validator, generated Python
that checks a map of numbers (node-metrics' ``metrics``, node-features' ``features``) at ~0.2-1.5 µs per
entry. :class:`EdgeDecoder` gives the same result and the same errors, faster, in one of two ways:

* **typed** (every shipped contract): a msgspec type made from the contract (:func:`typed_decoder`), at
  least as strict as the schema, decodes and checks the message in one C pass; the value is its
  ``msgspec.to_builtins``. A JSON number keeps its kind (an integer field or an integer in a number field
  stays an ``int``, as ``orjson`` gives it); keys follow the contract's order instead of the message's.
* **number maps**: the contract's validator without its number maps, and the maps by C-level passes whose
  limits are read from the contract: key lengths and pattern, number of keys, value bounds (a contract whose
  schema the typed decoder does not cover).

The names of a top-level map whose ``propertyNames`` rule the contract's validator checks against the names it
found valid before (:class:`app.contracts.loader.SchemaValidator`: node-metrics' ``metrics``, training-samples' and
rtt-predictions' ``features``) are checked that way on both paths, after decoding, with the validator's own rule
(one remembered set per map, bounded): msgspec runs a key's pattern in Python for every key (a 30-key map took
22.6 µs to decode instead of 4.1 µs), and its key lengths, though checked in C, cost a 30-key map ~1 µs more.

Anything the fast path rejects goes through :func:`app.contracts.decode`, so the error and its ``reason``
are the contract's own; tests check both agree on generated input, for every contract. So does anything it
cannot read: msgspec raises ``RecursionError`` on nesting deeper than Python's stack (orjson reads 1,024 levels
and refuses deeper as ``invalid_json``) and ``UnicodeEncodeError`` on a ``str`` with a lone surrogate; the
decoder raises nothing but :class:`~app.errors.ContractError`, so a hostile message goes to dead letters with
its reason instead of stopping its consumer.

A message with fields its contract does not declare (a newer release's, :mod:`app.contracts.unknown`) fails the
typed pass, which stays strict, so a message without them is decoded as fast as ever. It is then decoded by a
second typed pass that ignores unknown fields at the top level, after ``orjson`` -- the reference's parser --
read it and named them (counted and logged); an unknown field deeper down, or anything that pass refuses, goes
to :func:`app.contracts.decode`, which drops unknown fields wherever they are.

>>> d = EdgeDecoder("node-metrics")
>>> d.mode
'typed'
>>> d(b'{"node":"n1","ts":1,"node_class":"cpu","metrics":{"cpu_iowait":0.5}}')["metrics"]
{'cpu_iowait': 0.5}
>>> d(b'{"node":"n1","ts":1,"node_class":"cpu","metrics":{"cpu_iowait":1e300}}')
Traceback (most recent call last):
...
app.errors.ContractError: schema: data.metrics.cpu_iowait must be smaller than or equal to 1000000000000000.0
"""

from __future__ import annotations

import copy
import dataclasses
import keyword
import math
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union

import fastjsonschema
import msgspec
import orjson

from app.contracts.codec import MAX_MESSAGE_BYTES, decode
from app.contracts.loader import SchemaValidator, contract
from app.contracts.unknown import UNKNOWN_FIELDS

_NOTES = {"description", "$schema", "title", "$comment"}  # keywords that do not constrain
_NUMBER_MAP_KEYS = _NOTES | {"type", "propertyNames", "additionalProperties", "maxProperties"}
_NUMBER_KEYS = {"type", "minimum", "maximum"}
_DOLLAR = re.compile(r"(?<!\\)\$")  # an unescaped ``$``


@dataclasses.dataclass(frozen=True)
class _MapLimits:
    """What a plain map of bounded numbers allows: its key lengths and pattern, its size, its values' range."""

    min_key: int
    max_key: int
    pattern: re.Pattern[str] | None
    max_keys: int
    lo: float
    hi: float


def _number_map(schema: dict[str, Any]) -> _MapLimits | None:
    """The limits of ``schema`` if it is a plain map of bounded numbers."""
    props, items = schema.get("propertyNames", {}), schema.get("additionalProperties")
    if set(schema) - _NUMBER_MAP_KEYS or schema.get("type") != "object" or not isinstance(props, dict):
        return None
    if set(props) - _NOTES - {"minLength", "maxLength", "pattern"}:
        return None
    if not isinstance(items, dict) or set(items) - _NUMBER_KEYS or items.get("type") != "number":
        return None
    pattern = props.get("pattern")
    return _MapLimits(int(props.get("minLength", 0)), int(props.get("maxLength", 1 << 30)),
                      re.compile(_DOLLAR.sub(r"\\Z", pattern)) if pattern is not None else None,
                      int(schema.get("maxProperties", 1 << 62)), float(items.get("minimum", -float("inf"))),
                      float(items.get("maximum", float("inf"))))


_TYPED_KEYS = _NOTES | {"type", "enum", "minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum",
                        "exclusiveMaximum", "items", "minItems", "maxItems", "properties", "required",
                        "additionalProperties", "propertyNames", "minProperties", "maxProperties"}
_INT64 = (-(2**63), 2**63 - 1)  # msgspec bounds fit int64; orjson reads integers beyond 64 bits as floats


class _Unsupported(Exception):
    """The schema uses something the typed decoder does not express (the decoder falls back)."""


def typed_decoder(schema: dict[str, Any], name: str = "Value",
                  ignore_unknown: bool = False) -> msgspec.json.Decoder[Any] | None:
    """A msgspec decoder that accepts a subset of what ``schema`` accepts (None if the schema is beyond it);
    with ``ignore_unknown`` the top-level object ignores the fields it does not declare (nested ones do not).

    Supported: ``type`` (one or a list), ``enum`` of strings, string lengths and ``pattern``, number bounds (draft-07
    ``exclusiveMinimum`` / ``exclusiveMaximum`` numbers), arrays with ``items`` and lengths, objects with
    ``properties`` and ``additionalProperties: false`` (a struct; fields not ``required`` may be absent),
    and maps (``additionalProperties`` a schema, ``propertyNames`` lengths and pattern, ``minProperties`` and
    ``maxProperties``). A ``number`` is ``int |
    float``, so integers stay integers; integers beyond 64 bits are refused (``orjson`` reads them as
    floats). What it refuses may still be valid: :class:`EdgeDecoder` then asks the reference decoder.

    >>> d = typed_decoder({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}},
    ...                    "required": ["n"], "additionalProperties": False})
    >>> msgspec.to_builtins(d.decode(b'{"n": 3}'))
    {'n': 3}
    >>> typed_decoder({"type": "string", "format": "date"}) is None
    True
    """
    try:
        return msgspec.json.Decoder(_typed(schema, name, ignore_unknown))
    except _Unsupported:
        return None


def _typed(schema: Any, name: str, ignore_unknown: bool = False) -> Any:
    if not isinstance(schema, dict) or set(schema) - _TYPED_KEYS:
        raise _Unsupported(name)
    if "enum" in schema:
        values = schema["enum"]
        if schema.get("type", "string") != "string" or not values or not all(isinstance(v, str) for v in values):
            raise _Unsupported(name)
        return Literal[tuple(values)]
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    members = [m for kind in kinds for m in _members(kind, schema, name, ignore_unknown)]
    return members[0] if len(members) == 1 else Union[tuple(members)]  # noqa: UP007 - built at run time


def _members(kind: Any, schema: dict[str, Any], name: str, ignore_unknown: bool = False) -> list[Any]:
    """The msgspec types for one JSON type of ``schema`` (a number is two: int and float)."""
    meta = msgspec.Meta
    if kind == "null":
        return [type(None)]
    if kind == "boolean":
        return [bool]
    if kind == "string":
        return [_string(schema)]
    if kind in ("number", "integer"):
        lo, hi = schema.get("minimum"), schema.get("maximum")
        above, below = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
        ints = [_INT64[0]] + ([math.ceil(lo)] if lo is not None else []) + (
            [math.floor(above) + 1] if above is not None else [])
        top = [_INT64[1]] + ([math.floor(hi)] if hi is not None else []) + (
            [math.ceil(below) - 1] if below is not None else [])
        out: list[Any] = [Annotated[int, meta(ge=max(ints), le=min(top))]]
        if kind == "number":
            limits: dict[str, Any] = {"ge": lo, "le": hi, "gt": above, "lt": below}
            out.append(Annotated[float, meta(**limits)])
        return out
    if kind == "array":
        item = _typed(schema["items"], name + "Item") if "items" in schema else Any
        return [Annotated[list[item], meta(min_length=schema.get("minItems"),  # type: ignore[valid-type]
                                           max_length=schema.get("maxItems"))]]
    if kind == "object":
        return [_object(schema, name, ignore_unknown)]
    raise _Unsupported(name)


def _string(schema: dict[str, Any]) -> Any:
    """A string with the schema's lengths and ``pattern``, matched as the contract's validator does: searched,
    with ``$`` the end of the string (Python's ``$`` also matches before a final newline)."""
    pattern = schema.get("pattern")
    if pattern is not None:
        pattern = _DOLLAR.sub(r"\\Z", pattern)
    return Annotated[str, msgspec.Meta(min_length=schema.get("minLength"), max_length=schema.get("maxLength"),
                                       pattern=pattern)]


def _object(schema: dict[str, Any], name: str, ignore_unknown: bool = False) -> Any:
    extra = schema.get("additionalProperties", True)
    if "properties" in schema:
        if extra is not False or {"propertyNames", "minProperties", "maxProperties"} & set(schema):
            raise _Unsupported(name)  # unknown fields allowed: a struct would drop them
        required = set(schema.get("required", ()))
        fields: list[Any] = []
        for prop, sub in schema["properties"].items():
            if not prop.isidentifier() or keyword.iskeyword(prop) or prop.startswith("_"):
                raise _Unsupported(name)
            kind = _typed(sub, name + prop.title().replace("_", ""))
            fields.append((prop, kind) if prop in required else (prop, kind | msgspec.UnsetType, msgspec.UNSET))
        if required - set(schema["properties"]):
            raise _Unsupported(name)
        return msgspec.defstruct(name, fields, kw_only=True, forbid_unknown_fields=not ignore_unknown)
    keys = schema.get("propertyNames", {})
    if not isinstance(keys, dict) or set(keys) - _NOTES - {"minLength", "maxLength", "pattern"} or extra is False:
        raise _Unsupported(name)
    key = _string(keys)
    value = Any if extra is True else _typed(extra, name + "Value")
    size = {k: schema[j] for k, j in (("min_length", "minProperties"), ("max_length", "maxProperties")) if j in schema}
    if size:
        return Annotated[dict[key, value], msgspec.Meta(**size)]  # type: ignore[valid-type]
    return dict[key, value]  # type: ignore[valid-type]


class EdgeDecoder:
    """``decoder(raw) -> dict``: same result and errors as ``decode(topic, raw)``, faster (see the module).

    :attr:`mode` says how: ``typed``, ``maps`` (number maps checked in C, the rest by the contract's
    validator) or ``plain`` (the contract's validator).
    """

    def __init__(self, topic: str, typed: bool = True) -> None:
        self.topic = topic
        schema = contract(topic).value_schema
        struct = "".join(part.title() for part in topic.split("-"))
        validator = contract(topic).validator
        rules = validator.rules if isinstance(validator, SchemaValidator) else {}
        # the maps whose names the validator's rules check (after decoding): decoded without a rule for their keys
        self._names = tuple((prop, rule.all_ok) for prop, rule in rules.items())
        loose = copy.deepcopy(schema) if rules else schema
        for prop in rules:
            del loose["properties"][prop]["propertyNames"]
        self._typed = typed_decoder(loose, struct) if typed else None  # typed=False: the paths below (benches)
        self._lenient = typed_decoder(loose, struct, ignore_unknown=True) if self._typed is not None else None
        self._declared = frozenset(schema.get("properties", ()))
        self._maps: dict[str, _MapLimits] = {}  # the number maps, checked apart when not typed
        if self._typed is None:
            for name, sub in loose.get("properties", {}).items():
                limits = _number_map(sub)
                if limits is not None:
                    self._maps[name] = limits
        self.mode = "typed" if self._typed is not None else "maps" if self._maps else "plain"
        # without number maps the envelope is the contract's own validator (no per-message lookup)
        self._envelope: Callable[[Any], Any] = contract(topic).validator
        if self._maps:
            envelope = copy.deepcopy(schema)
            for name in self._maps:
                envelope["properties"][name] = {"type": "object"}
            self._envelope = fastjsonschema.compile(envelope)

    def __call__(self, raw: bytes | str | None) -> dict[str, Any]:
        if raw is None or len(raw) > MAX_MESSAGE_BYTES:
            return decode(self.topic, raw)
        if self._typed is not None:
            try:
                out: dict[str, Any] = msgspec.to_builtins(self._typed.decode(raw))
            except msgspec.DecodeError:  # unknown fields, invalid JSON or outside the typed subset
                return self._unknown_fields(raw)
            except Exception:  # what msgspec cannot read (deep nesting, see the module): the reference's answer
                return decode(self.topic, raw)
            return out if self._names_ok(out) else decode(self.topic, raw)
        try:
            value = orjson.loads(raw)
            self._envelope(value)
        except Exception:  # invalid JSON, a schema violation or anything else: the reference's answer
            return decode(self.topic, raw)
        if not isinstance(value, dict) or not all(self._map_ok(value.get(k), lim) for k, lim in self._maps.items()):
            return decode(self.topic, raw)
        return value if self._names_ok(value) else decode(self.topic, raw)

    def conforms(self, value: dict[str, Any]) -> bool:
        """Whether ``value``, already a dict (a message about to be sent), passes the typed pass and the names' rules
        (False also where there is no typed pass: ask the contract, :func:`app.contracts.decode`)."""
        if self._typed is None:
            return False
        try:
            msgspec.convert(value, self._typed.type)
        except (msgspec.ValidationError, TypeError, ValueError):
            return False
        return self._names_ok(value)

    def _names_ok(self, value: Any) -> bool:
        """Whether the names of the maps the validator's rules check are ones they take (the names they found
        valid before are not checked again), as :class:`app.contracts.loader.SchemaValidator` checks them."""
        if not isinstance(value, dict):
            return True
        for prop, all_ok in self._names:
            m = value.get(prop)
            if isinstance(m, dict) and m and not all_ok(m):
                return False
        return True

    def _unknown_fields(self, raw: bytes | str) -> dict[str, Any]:
        """A message the strict typed pass refused: typed again without the top-level fields the contract does
        not declare, once ``orjson`` read it (so what the reference refuses as JSON is refused here too);
        whatever else, or with nothing unknown at the top, the contract's answer."""
        if self._lenient is None:
            return decode(self.topic, raw)
        try:
            value = msgspec.to_builtins(self._lenient.decode(raw))
            unknown = [k for k in orjson.loads(raw) if k not in self._declared]
        except Exception:  # refused, or what msgspec cannot read (see the module): the reference's answer
            return decode(self.topic, raw)
        if not unknown or not self._names_ok(value):
            return decode(self.topic, raw)
        UNKNOWN_FIELDS.note(self.topic, unknown)
        return value  # type: ignore[no-any-return]

    @staticmethod
    def _map_ok(m: Any, limits: _MapLimits) -> bool:
        if m is None:
            return True  # absent (the envelope checked required fields)
        if not m:
            return True
        if len(m) > limits.max_keys:
            return False
        vals = m.values()
        types = set(map(type, vals))
        if not types <= {float, int}:
            return False
        lengths = list(map(len, m))
        if not (limits.min_key <= min(lengths) and max(lengths) <= limits.max_key):
            return False
        if limits.pattern is not None and not all(map(limits.pattern.search, m)):
            return False
        return limits.lo <= min(vals) and max(vals) <= limits.hi
