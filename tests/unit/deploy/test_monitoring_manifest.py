"""k8s/optional/monitoring.yaml, for a cluster running the Prometheus Operator: its PodMonitor scrapes every pod
of k8s/ that carries the prometheus.io/* annotations, on the same port and path, under the job names
deploy/prometheus/prometheus.yml gives (which the alerts and the runbook's queries read); its PrometheusRule holds
deploy/prometheus/rules.yml's groups unchanged."""

from __future__ import annotations

from typing import Any

import yaml
from test_alerts import REPO, RULES_FILE
from test_manifests import DOCS, _pod_specs

MONITORING = REPO / "k8s" / "optional" / "monitoring.yaml"
OBJECTS = {d["kind"]: d for d in yaml.safe_load_all(MONITORING.read_text()) if d}
PROMETHEUS = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    ok = selector.get("matchLabels", {}).items() <= labels.items()
    for e in selector.get("matchExpressions", []):
        assert e["operator"] == "In", e
        ok = ok and labels.get(e["key"]) in e["values"]
    return ok


def test_the_prometheus_rule_holds_the_rules_file_s_groups_unchanged():
    assert set(OBJECTS) == {"PodMonitor", "PrometheusRule"}
    assert OBJECTS["PrometheusRule"]["spec"]["groups"] == yaml.safe_load(RULES_FILE.read_text())["groups"]


def test_the_pod_monitor_scrapes_every_annotated_pod_on_its_port_and_path_and_nothing_else():
    monitor = OBJECTS["PodMonitor"]
    namespaces = {d["metadata"]["name"] for d in DOCS if d["kind"] == "Namespace"}
    assert monitor["metadata"]["namespace"] in namespaces
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    annotated, selected = set(), set()
    for doc, spec in _pod_specs():
        meta = doc["spec"]["template"]["metadata"]
        name = meta["labels"]["app.kubernetes.io/name"]
        if meta.get("annotations", {}).get("prometheus.io/scrape") == "true":
            annotated.add(name)
        if doc["metadata"].get("namespace") != monitor["metadata"]["namespace"] \
                or not _selects(monitor["spec"]["selector"], meta["labels"]):
            continue
        selected.add(name)
        ports = {p.get("name"): p["containerPort"] for c in spec["containers"] for p in c.get("ports", [])}
        scraped = [(ports[e["port"]], e.get("path", "/metrics")) for e in endpoints if e["port"] in ports]
        note = meta["annotations"]
        want = (int(note["prometheus.io/port"]), note.get("prometheus.io/path", "/metrics"))
        assert scraped == [want], (name, scraped, want)
    assert selected == annotated and annotated


def test_the_pod_monitor_names_jobs_as_the_compose_prometheus_does():
    """jobLabel: the job is the pod's app.kubernetes.io/name, which for every component compose scrapes is the
    job name prometheus.yml gives it (the pods watcher runs only in a cluster)."""
    monitor = OBJECTS["PodMonitor"]
    assert monitor["spec"]["jobLabel"] == "app.kubernetes.io/name"
    compose_jobs = {j["job_name"] for j in PROMETHEUS["scrape_configs"] if j["job_name"].startswith("rttsched-")}
    (names,) = [e["values"] for e in monitor["spec"]["selector"]["matchExpressions"]
                if e["key"] == "app.kubernetes.io/name"]
    assert compose_jobs <= set(names) and compose_jobs
