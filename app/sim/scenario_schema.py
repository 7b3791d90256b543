"""A scenario document against ``app/sim/scenario.schema.json``, and the first problem said as (field, what is
wrong), not in the schema's own words ("must be valid exactly by one definition (0 matches found)").

A value that one of several shapes (``oneOf``) could take is checked against the shape its type fits, so the
problem inside it is named (a node's unknown key, a count below its minimum); a value no shape fits gets
the shapes' descriptions. Unknown keys and names are listed beside the known ones.

>>> schema_problem({"name": "x", "workload": {"kind": "poisson"}, "apps": {"Foo": 1}})
('apps', "unknown app 'Foo' (known: upload, gCTF, Motioncor2)")
>>> schema_problem({"name": "x", "workload": {"kind": "poisson"}, "cluster": {"nodes": [{"class": "cpu", "count": 0}]}})
('cluster.nodes[0].count', 'must be >= 1 (got 0)')
>>> schema_problem({"name": "x", "workload": {"kind": "poisson"}}) is None
True
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import fastjsonschema

SCHEMA_PATH = Path(__file__).with_name("scenario.schema.json")
JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str), "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict), "boolean": lambda v: isinstance(v, bool),
}
WORDS = (("bigger than or equal to", ">="), ("smaller than or equal to", "<="), ("bigger than", ">"),
         ("smaller than", "<"))
TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string", "array": "a list",
              "object": "a mapping", "boolean": "true or false", "null": "null"}
LEAST = {"minItems": "items", "minProperties": "entries", "minLength": "characters"}


@functools.cache
def schema() -> dict[str, Any]:
    return dict(json.loads(SCHEMA_PATH.read_text()))


@functools.cache
def _compiled(part: str) -> Any:
    """A validator of one part of the schema (JSON text), its ``$ref``s resolved against the whole's."""
    return fastjsonschema.compile({"definitions": schema()["definitions"], **json.loads(part)})


def validator() -> Any:
    """The whole schema's validator (raises ``fastjsonschema.JsonSchemaValueException``)."""
    return _compiled(json.dumps(schema()))


def _resolve(part: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = part.get("$ref", "")
    return schema()["definitions"][ref.rsplit("/", 1)[-1]] if ref.startswith("#/definitions/") else part


def _fits(part: Mapping[str, Any], value: Any) -> bool:
    kind = part.get("type")
    return kind is None or any(JSON_TYPES[k](value) for k in ([kind] if isinstance(kind, str) else kind))


def _got(message: str, value: Any) -> str:
    return message if isinstance(value, dict | list) else f"{message} (got {value!r})"


def _explain(exc: fastjsonschema.JsonSchemaValueException, base: str = "") -> tuple[str, str]:
    """(field, problem) of a validation error; ``base``: the field the validated value sits at."""
    name = exc.name or "data"
    field = (base + name.removeprefix("data")).removeprefix(".")
    value, rule, ruled = exc.value, exc.rule, exc.rule_definition
    definition = exc.definition or {}
    if rule == "oneOf":
        shapes = [_resolve(p) for p in ruled]
        fitting = [p for p in shapes if _fits(p, value)]
        if len(fitting) == 1:
            try:
                _compiled(json.dumps(fitting[0]))(value)
            except fastjsonschema.JsonSchemaValueException as inner:
                return _explain(inner, "." + field if field else "")
        wanted = " or ".join(p.get("description") or str(p.get("type", "?")) for p in shapes)
        return field, _got(f"must be {wanted}", value)
    if rule == "propertyNames" and isinstance(value, dict):
        known = list(ruled.get("enum", []))
        bad = next((k for k in value if k not in known), "?")
        return field, f"unknown {ruled.get('description', 'key')} {bad!r} (known: {', '.join(known)})"
    if rule == "additionalProperties" and ruled is False and isinstance(value, dict):
        known = list(definition.get("properties", {}))
        bad = next((k for k in value if k not in known), "?")
        return field, f"unknown key {bad!r} (known: {', '.join(known)})"
    if rule == "required" and isinstance(value, dict):
        missing = next((k for k in ruled if k not in value), "?")
        return f"{field}.{missing}" if field else missing, "is required"
    if rule == "pattern" and definition.get("description"):
        return field, _got(f"must be {definition['description']}", value)
    if rule == "type":
        kinds = [ruled] if isinstance(ruled, str) else list(ruled)
        return field, _got("must be " + " or ".join(TYPE_WORDS.get(k, k) for k in kinds), value)
    if rule in LEAST and isinstance(ruled, int):
        return field, _got("must not be empty" if ruled == 1 else f"must have at least {ruled} {LEAST[rule]}", value)
    message = exc.message.removeprefix(name).strip()
    for words, said in WORDS:
        message = message.replace(words, said)
    return field, _got(message, value)


def _at(field: str, key: str) -> str:
    return f"{field}.{key}" if field else key


def _float_for_integer(part: Mapping[str, Any], value: Any, field: str = "") -> tuple[str, str] | None:
    """The first float where ``part`` (a valid document's) says integer: JSON Schema counts 2.0 as one, the
    runs do not (``range``, numpy's ``SeedSequence``)."""
    part = _resolve(part)
    if "oneOf" in part:
        shapes = [_resolve(p) for p in part["oneOf"]]
        fitting = [p for p in shapes if _fits(p, value)]
        if not fitting:
            wanted = " or ".join(p.get("description") or str(p.get("type", "?")) for p in shapes)
            return field, _got(f"must be {wanted}", value)
        return _float_for_integer(fitting[0], value, field)
    if part.get("type") == "integer" and not JSON_TYPES["integer"](value):
        return field, _got("must be an integer", value)
    if isinstance(value, dict):
        props = part.get("properties", {})
        rest = part.get("additionalProperties")
        for key, item in value.items():
            sub = props.get(key, rest if isinstance(rest, dict) else None)
            problem = None if sub is None else _float_for_integer(sub, item, _at(field, str(key)))
            if problem:
                return problem
    if isinstance(value, list) and isinstance(part.get("items"), dict):
        for i, item in enumerate(value):
            problem = _float_for_integer(part["items"], item, f"{field}[{i}]")
            if problem:
                return problem
    return None


def schema_problem(doc: Any) -> tuple[str, str] | None:
    """The first problem of ``doc`` against the schema as (field, what is wrong); None when it is valid.

    >>> schema_problem({"name": "x", "workload": {"kind": "poisson", "tasks": 20.0}})
    ('workload.tasks', 'must be an integer (got 20.0)')
    """
    try:
        validator()(doc)
    except fastjsonschema.JsonSchemaValueException as exc:
        return _explain(exc)
    return _float_for_integer(schema(), doc)
