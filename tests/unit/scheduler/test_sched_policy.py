"""Policy files: YAML and JSON, defaults, and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import ConfigError
from app.scheduler.policy import Policy, load_policy, policy_from_dict


def test_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "sla_ms: {gCTF: 8000, Motioncor2: 30000}\n"
        "anti_affinity:\n  - [Motioncor2, Motioncor2]\n  - [gCTF, Motioncor2]\n"
        "contention: {interfering: 0.3}\nassumed: {ttl_s: 60, scrape_delay_s: 2}\nsla_when_all_fail: fail\n"
    )
    p = load_policy(path)
    assert p.sla("gCTF") == 8000.0 and p.sla("upload") is None
    assert p.interferes("Motioncor2", "gCTF") and p.interferes("gCTF", "Motioncor2")
    assert not p.interferes("gCTF", "gCTF")
    assert (p.contention_interfering, p.contention_other) == (0.3, Policy().contention_other)
    assert (p.assumed_ttl_s, p.scrape_delay_s, p.sla_when_all_fail) == (60.0, 2.0, "fail")


def test_json_file_and_empty_path(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text('{"sla_ms": {"upload": 100}}')
    assert load_policy(path).sla("upload") == 100.0
    assert load_policy("") == Policy()


@pytest.mark.parametrize(("doc", "field"), [
    ({"sla_ms": {"gCTF": 0}}, "policy.sla_ms.gCTF"),
    ({"sla_ms": {"gCTF": "fast"}}, "policy.sla_ms.gCTF"),
    ({"sla_ms": [1]}, "policy.sla_ms"),
    ({"anti_affinity": [["a"]]}, "policy.anti_affinity[0]"),
    ({"anti_affinity": [["a", 3]]}, "policy.anti_affinity[0][1]"),
    ({"contention": {"other": -0.1}}, "policy.contention.other"),
    ({"assumed": {"ttl_s": 0}}, "policy.assumed.ttl_s"),
    ({"sla_when_all_fail": "maybe"}, "policy.sla_when_all_fail"),
    ({"slas": {}}, "policy.slas"),
    ({"contention": {"interfering": 0.5, "othr": 0.9}}, "policy.contention.othr"),
    ({"assumed": {"ttl": 60}}, "policy.assumed.ttl"),
    ({"exploration": {"shares": 0.1}}, "policy.exploration.shares"),
    ({"objective": {"inflict": 1}}, "policy.objective.inflict"),
    ({1: 2, "sla_ms": {}}, "policy.1"),
    ({"sla_ms": {"gCTF": 10**400}}, "policy.sla_ms.gCTF"),
    ([1, 2], "policy"),
])
def test_bad_values_name_their_field(doc: object, field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        policy_from_dict(doc)
    assert exc.value.field == field


def test_unreadable_or_invalid_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="RTT_EXTENDER_POLICY_FILE"):
        load_policy(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("sla_ms: {gCTF: [\n")
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        load_policy(bad)
    assert "\n" not in str(info.value) and "line 2, column 1: " in str(info.value)  # one line, the spot named


def test_an_unknown_nested_key_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"policy.contention.othr: unknown field \(known: interfering, other\)"):
        policy_from_dict({"contention": {"othr": 0.9}})


def test_a_file_that_is_not_utf8_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_bytes(b"\xff\xfebad\n")
    with pytest.raises(ConfigError, match=r"RTT_EXTENDER_POLICY_FILE: cannot read .*policy.yaml: 'utf-8' codec"):
        load_policy(path)
