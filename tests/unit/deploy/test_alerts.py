"""deploy/prometheus/rules.yml: loaded by Prometheus, every expression valid PromQL on metrics the code
defines, every alert pointing at a runbook section that exists; and the runbook's and the dashboard's own
queries valid PromQL too."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from test_compose import DASHBOARD, PROMETHEUS, SERVICES, _panels

REPO = Path(__file__).resolve().parents[3]
RULES_FILE = REPO / "deploy" / "prometheus" / "rules.yml"
RULES: list[dict[str, Any]] = [r for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"]]
RUNBOOK = (REPO / "docs" / "runbook.md").read_text()


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading.

    >>> anchor("2. Prediction latency jumps from ~5 ms to 200 ms+")
    '2-prediction-latency-jumps-from-5-ms-to-200-ms'
    """
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_prometheus_loads_the_rules_file_compose_mounts():
    (path,) = PROMETHEUS["rule_files"]
    mounts = dict(str(v).split(":")[:2] for v in SERVICES["prometheus"]["volumes"])
    assert mounts["./deploy/prometheus/rules.yml"] == path


def test_every_alert_has_a_valid_expression_a_severity_and_a_summary():
    names = [r["alert"] for r in RULES]
    assert len(names) == len(set(names)) and len(names) >= 9
    for r in RULES:
        promql_parser.parse(r["expr"])  # raises on invalid PromQL
        assert r["labels"]["severity"] in ("critical", "warning", "info"), r["alert"]
        assert r["annotations"]["summary"], r["alert"]
        assert re.fullmatch(r"\d+[smh]", r.get("for", "0s")), r["alert"]


def test_alerts_query_only_metrics_the_code_defines(undefined_metrics):
    missing = undefined_metrics([r["expr"] for r in RULES])
    assert not missing, f"deploy/prometheus/rules.yml queries metrics no module of app/ defines: {sorted(missing)}"


def test_every_alert_points_at_a_runbook_section_and_every_section_has_one():
    sections = {anchor(h) for h in re.findall(r"^## (\d+\..*)$", RUNBOOK, flags=re.M)}
    pointed = set()
    for r in RULES:
        doc, _, section = r["annotations"]["runbook"].partition("#")
        assert doc == "docs/runbook.md" and section in sections, (r["alert"], section)
        pointed.add(section)
    assert pointed == sections  # no symptom of the runbook without an alert


def _alerts_lines() -> dict[str, str]:
    """Each numbered runbook section's anchor and its **Alerts:** paragraph (empty where it has none)."""
    parts = re.split(r"^## (\d+\..*)$", RUNBOOK, flags=re.M)
    out = {}
    for heading, body in zip(parts[1::2], parts[2::2], strict=True):
        m = re.search(r"^\*\*Alerts:\*\*(.*?)(?:\n\n|\Z)", body, flags=re.M | re.S)
        out[anchor(heading)] = m.group(1) if m else ""
    return out


def test_each_runbook_section_names_the_alerts_that_point_at_it():
    """Someone paged by an alert finds it by its name: the section its ``runbook`` annotation links names it in
    its **Alerts:** line, and names no alert that links elsewhere (twelve of the 21 were named nowhere)."""
    lines = _alerts_lines()
    pointing: dict[str, set[str]] = {section: set() for section in lines}
    for r in RULES:
        pointing[r["annotations"]["runbook"].partition("#")[2]].add(r["alert"])
    for section, text in lines.items():
        named = set(re.findall(r"`(Rttsched\w+)`", text))
        assert named == pointing[section], (f"docs/runbook.md#{section}: its Alerts: line names {sorted(named)}, "
                                            f"the alerts linking it are {sorted(pointing[section])}")


@pytest.mark.parametrize("where", ["runbook", "dashboard"])
def test_the_runbook_s_and_the_dashboard_s_queries_are_valid_promql(where):
    if where == "runbook":
        blocks = re.findall(r"```promql\n(.*?)```", RUNBOOK, flags=re.S)
        exprs = [line for block in blocks for line in block.splitlines() if line.strip() and not line.startswith("#")]
    else:
        exprs = [t["expr"] for p in _panels() for t in p["targets"]]
    assert exprs and DASHBOARD
    for expr in exprs:
        try:
            promql_parser.parse(expr)
        except ValueError as exc:
            pytest.fail(f"{where}: {expr!r}: {exc}")
