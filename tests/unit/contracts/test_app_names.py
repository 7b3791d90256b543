"""Every app the contracts accept gives model keys the model registry stores.

An app is a Kubernetes label value (a pod's ``rttsched.io/app``). Before the contracts said so, an app such as
``POST /upload`` (a span name) passed every topic, and its model was trained and then refused by the registry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fastjsonschema
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from app.contracts import contract, validate
from app.contracts.keys import APP_PATTERN, model_key, parse_model_key
from app.errors import ContractError
from app.registry.base import check_model_key
from app.sim.apps import APPS

ROOT = Path(__file__).resolve().parents[3]
APP = contract("task-completions").value_schema["properties"]["app"]
APP_PLACES = [("task-completions", ("app",)), ("rtt-predictions", ("app",)), ("training-samples", ("app",)),
              ("node-features", ("app_features", "propertyNames")),
              ("node-weights", ("predicted_rtt_ms", "propertyNames")),
              ("node-weights", ("correction", "propertyNames")), ("node-weights", ("samples", "propertyNames")),
              ("prediction-errors", ("apps", "propertyNames"))]
KEY_PLACES = [("training-samples", ("model_key",)), ("rtt-predictions", ("model_key",)),
              ("retrain-events", ("model_key",)), ("model-updates", ("model_key",)),
              ("prediction-errors", ("apps", "additionalProperties", "properties", "model_key"))]


def place(topic: str, path: tuple[str, ...]) -> dict[str, Any]:
    schema = contract(topic).value_schema["properties"]
    for step in path:
        schema = schema[step]
    return schema  # type: ignore[no-any-return]


def accepted(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    """Strings ``schema`` accepts."""
    check = fastjsonschema.compile(schema)
    strings = st.from_regex(schema["pattern"], fullmatch=True) if "pattern" in schema else st.text()

    def ok(v: str) -> bool:
        try:
            check(v)
            return True
        except fastjsonschema.JsonSchemaValueException:
            return False

    return strings.filter(ok)


KEY_VALIDATORS = [fastjsonschema.compile(place(t, p)) for t, p in KEY_PLACES]
apps = accepted(APP)


@pytest.mark.parametrize(("topic", "path"), APP_PLACES)
def test_every_app_in_every_contract_is_a_label_value(topic: str, path: tuple[str, ...]) -> None:
    schema = place(topic, path)
    assert (schema.get("pattern"), schema.get("maxLength")) == (APP.get("pattern"), APP["maxLength"])
    assert APP.get("pattern") == "^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$" == f"^{APP_PATTERN.pattern}$"


@given(apps, st.sampled_from(["cpu", "gpu"]))
def test_an_accepted_app_gives_a_key_that_parses_back_and_the_registry_stores(app: str, node_class: str) -> None:
    key = model_key(app, node_class)
    assert parse_model_key(key) == (app, node_class, None)
    assert check_model_key(key) == key
    for check in KEY_VALIDATORS:  # and a model_key every contract that carries one accepts
        check(key)


@given(apps, st.sampled_from(["cpu", "gpu"]), st.from_regex(r"^[a-z0-9]([-a-z0-9.]{0,60}[a-z0-9])?$", fullmatch=True))
def test_a_node_model_key_of_a_kubernetes_node_is_stored_too(app: str, node_class: str, node: str) -> None:
    key = model_key(app, node_class, node)
    assert parse_model_key(key) == (app, node_class, node)
    assert check_model_key(key) == key
    for check in KEY_VALIDATORS:
        check(key)


def completion(app: str) -> dict[str, Any]:
    return {"task_id": "t", "app": app, "node": "worker-1", "submitted_ts": 1.0, "started_ts": 1.0, "finished_ts": 2.0,
            "rtt_ms": 1000.0, "status": "ok"}


@pytest.mark.parametrize("app", ["POST /upload", "gCTF run", "grpc:Process", "上传", "gCTF\n", "-gCTF", "gCTF.", "",
                                 "a" * 65])
def test_a_name_no_label_could_carry_is_refused(app: str) -> None:
    with pytest.raises(ContractError) as got:
        validate("task-completions", completion(app))
    assert got.value.reason == "schema"


def repo_apps() -> set[str]:
    """The apps of the simulator, the shipped policy, the pod and span fixtures."""
    names = set(APPS)
    policy = yaml.safe_load((ROOT / "deploy" / "extender" / "policy.yaml").read_text())
    names |= set(policy["sla_ms"]) | {a for pair in policy.get("anti_affinity") or () for a in pair}
    for path in (ROOT / "tests" / "fixtures" / "kube").glob("*.json"):
        text = path.read_text()
        names |= {v for k, v in _pairs(json.loads(text)) if k == "rttsched.io/app"}
    for path in (ROOT / "tests" / "fixtures" / "spans").glob("*.json"):
        names |= {_string(t) for t in _tags(json.loads(path.read_text())) if t.get("key") == "rtt.app"}
    return names


def _pairs(doc: Any) -> list[tuple[str, Any]]:
    if isinstance(doc, dict):
        return [*doc.items(), *(p for v in doc.values() for p in _pairs(v))]
    if isinstance(doc, list):
        return [p for v in doc for p in _pairs(v)]
    return []


def _tags(doc: Any) -> list[dict[str, Any]]:
    found = [doc] if isinstance(doc, dict) and "key" in doc else []
    values = doc.values() if isinstance(doc, dict) else doc if isinstance(doc, list) else []
    return found + [t for v in values for t in _tags(v)]


def _string(tag: dict[str, Any]) -> str:
    value = tag.get("value", tag.get("vStr"))
    return str(value["stringValue"] if isinstance(value, dict) else value)


def test_the_apps_the_repository_uses_are_accepted() -> None:
    names = repo_apps()
    assert {"upload", "gCTF", "Motioncor2"} <= names
    for app in sorted(names):
        validate("task-completions", completion(app))
        check_model_key(model_key(app, "gpu"))
