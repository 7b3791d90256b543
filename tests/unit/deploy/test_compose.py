"""docker-compose.yml, Prometheus, Grafana and the image hang together, without a Docker engine.

The compose file is parsed with PyYAML (anchors and merge keys resolved) and every cross-reference
is checked: service names, images, ports, start order, commands, settings, scrape targets, the
dashboard's datasource and the metrics it queries.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

REPO = Path(__file__).resolve().parents[3]
COMPOSE: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
PROMETHEUS = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
DASHBOARD = json.loads((REPO / "deploy" / "grafana" / "dashboards" / "rttsched.json").read_text())
GRAFANA = REPO / "deploy" / "grafana" / "provisioning"
COMPONENTS = ("bridge", "worker", "trainer", "extender")
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


def _env(name: str) -> dict[str, str]:
    env = SERVICES[name].get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _ports(name: str) -> list[tuple[int, int]]:
    out = []
    for spec in SERVICES[name].get("ports", []):
        host, container = str(spec).rsplit(":", 1) if ":" in str(spec) else (None, str(spec))
        out.append((int(str(host).rsplit(":", 1)[-1]) if host else 0, int(container.split("/")[0])))
    return out


def _project_services(project_image: str) -> list[str]:
    return [n for n, s in SERVICES.items() if s.get("image") == project_image or "build" in s]


def _metrics_port(name: str) -> int:
    env = _env(name)
    return int(env.get("RTT_METRICS_PORT") or env["RTT_EXTENDER_PORT"])


def _panels() -> list[dict[str, Any]]:
    return [p for p in DASHBOARD["panels"] if p["type"] != "row"]


def test_the_stack_has_every_service():
    assert {"kafka", "redis", "topics", *COMPONENTS, "prometheus", "grafana"} <= set(SERVICES)


def test_images_are_pinned_and_components_share_the_project_image(project_image, is_third_party):
    for name, svc in SERVICES.items():
        image = svc["image"]
        if is_third_party(image):
            assert ":" in image and not image.endswith(":latest"), f"{name}: unpinned {image}"
        else:
            assert image == project_image, name
            assert svc["build"]["context"] == "." and (REPO / svc["build"]["dockerfile"]).is_file(), name
    assert set(_project_services(project_image)) >= {"topics", *COMPONENTS}
    assert SERVICES["kafka"]["image"].startswith("apache/kafka:")


def test_published_ports_are_unique_and_the_extender_publishes_its_own():
    published = [host for name in SERVICES for host, _ in _ports(name) if host]
    assert len(published) == len(set(published))
    assert (8888, int(_env("extender")["RTT_EXTENDER_PORT"])) in _ports("extender")


def test_published_ports_are_on_the_loopback_only():
    """Kafka's host listener, the extender and Prometheus ask for no credentials: nothing is published beyond the
    machine (docs/deploy.md says to go through SSH)."""
    for name, svc in SERVICES.items():
        for spec in svc.get("ports", []):
            assert str(spec).startswith("127.0.0.1:"), f"{name} publishes {spec} on every interface"


# where each stateful service keeps its data: Kafka where KAFKA_LOG_DIRS says, Redis's --save, Prometheus's TSDB
DATA_DIRS = {"kafka": _env("kafka").get("KAFKA_LOG_DIRS", "/tmp/kafka-logs"), "redis": "/data",
             "prometheus": "/prometheus"}


def test_stateful_services_keep_their_data_in_named_volumes():
    """`docker compose down` keeps the topics, the models and the metrics; only `down -v` drops them."""
    for name, path in DATA_DIRS.items():
        mounts = dict(reversed(str(v).split(":")[:2]) for v in SERVICES[name].get("volumes", []))
        assert mounts.get(path) in COMPOSE["volumes"], f"{name} keeps {path} in no named volume"
    assert DATA_DIRS["kafka"] == "/var/lib/kafka/data"  # the apache/kafka image's VOLUME, owned by its user


def test_start_order_is_sound():
    for name, svc in SERVICES.items():
        deps = svc.get("depends_on", {})
        for target, cond in (deps.items() if isinstance(deps, dict) else ((d, {}) for d in deps)):
            assert target in SERVICES and target != name, f"{name} depends on unknown {target}"
            condition = cond.get("condition", "service_started")
            assert condition in CONDITIONS, f"{name} -> {target}: {condition}"
            if condition == "service_healthy":
                assert "healthcheck" in SERVICES[target], f"{name} waits for {target} health; it has no healthcheck"
            if condition == "service_completed_successfully":
                assert SERVICES[target].get("restart") == "no", f"{target} is one-shot: restart must be 'no'"
    assert SERVICES["topics"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    for name in COMPONENTS:
        assert SERVICES[name]["depends_on"]["topics"]["condition"] == "service_completed_successfully", name
        assert "healthcheck" in SERVICES[name], name


def test_project_services_run_existing_cli_commands(check_cli, project_image, entrypoint):
    for name in _project_services(project_image):
        argv = list(SERVICES[name].get("entrypoint") or entrypoint) + list(SERVICES[name]["command"])
        assert check_cli(argv) is None, f"{name}: {check_cli(argv)}"


def test_every_setting_compose_and_the_image_set_exists(known_env, project_image):
    unknown = {(name, var) for name in _project_services(project_image) for var in _env(name)
               if (var.startswith("RTT_") or var == "REDIS_URL") and var not in known_env}
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    unknown |= {("Dockerfile", v) for v in re.findall(r"\b(RTT_\w+)=", dockerfile) if v not in known_env}
    assert not unknown, f"settings unknown to app/config.py Settings: {sorted(unknown)}"


def test_components_reach_kafka_and_redis_by_service_name(project_image):
    kafka = _env("kafka")
    advertised = {urlsplit(u).netloc for u in kafka["KAFKA_ADVERTISED_LISTENERS"].split(",")}
    for name in _project_services(project_image):
        env = _env(name)
        assert env["RTT_KAFKA_BOOTSTRAP"] in advertised, name
        assert env["RTT_KAFKA_BOOTSTRAP"].split(":")[0] in SERVICES, name
        assert urlsplit(env["REDIS_URL"]).hostname in SERVICES and urlsplit(env["REDIS_URL"]).port == 6379, name


def test_kafka_runs_kraft_as_a_single_broker_and_controller():
    env = _env("kafka")
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    voter_id, voter = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split("@")
    assert voter_id == env["KAFKA_NODE_ID"] and voter.split(":")[0] == "kafka"
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] in env["KAFKA_LISTENERS"]
    assert len(base64.urlsafe_b64decode(env["CLUSTER_ID"] + "==")) == 16
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"


def test_bind_mounts_exist_in_the_repository():
    for name, svc in SERVICES.items():
        for vol in svc.get("volumes", []):
            source = str(vol).split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), f"{name} mounts missing {source}"


def test_trainer_pins_its_cpus_consistently():
    assert SERVICES["trainer"]["cpuset"] == _env("trainer")["RTT_TRAINER_CPUS"]


def _scrape_targets() -> dict[str, set[int]]:
    targets: dict[str, set[int]] = {}
    for job in PROMETHEUS["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            for host in sd["names"]:
                targets.setdefault(host, set()).add(int(sd["port"]))
        for sc in job.get("static_configs", []):
            for target in sc["targets"]:
                host, port = target.rsplit(":", 1)
                targets.setdefault(host, set()).add(int(port))
    return targets


def test_prometheus_scrapes_every_component_on_its_metrics_port():
    targets = _scrape_targets()
    for name in COMPONENTS:
        assert targets.get(name) == {_metrics_port(name)}, f"{name}: scraped on {targets.get(name)}"
    for host in set(targets) - {"localhost"}:
        assert host in SERVICES, f"prometheus scrapes {host}, which is no compose service"
    assert any(str(v).endswith(":/etc/prometheus/prometheus.yml:ro") for v in SERVICES["prometheus"]["volumes"])


def test_grafana_provisions_the_datasource_and_dashboard_it_uses():
    (ds,) = yaml.safe_load((GRAFANA / "datasources" / "prometheus.yaml").read_text())["datasources"]
    url = urlsplit(ds["url"])
    assert url.hostname == "prometheus" and url.port in {c for _, c in _ports("prometheus")}
    uids = {p["datasource"]["uid"] for p in _panels()}
    uids |= {t["datasource"]["uid"] for p in _panels() for t in p["targets"]}
    assert uids == {ds["uid"]}
    (provider,) = yaml.safe_load((GRAFANA / "dashboards" / "rttsched.yaml").read_text())["providers"]
    mounts = dict(str(v).split(":")[:2] for v in SERVICES["grafana"]["volumes"])
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"


def test_dashboard_panels_are_distinct_and_cover_the_feedback_loop():
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    exprs = " ".join(t["expr"] for p in _panels() for t in p["targets"])
    for needed in ("prediction", "retrains", "node_weight", "extender_request_seconds"):
        assert needed in exprs, f"the dashboard shows no {needed}"
    cells: set[tuple[int, int]] = set()
    for p in DASHBOARD["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        cell = {(g["y"] + dy, g["x"] + dx) for dy in range(g["h"]) for dx in range(g["w"])}
        assert not cells & cell, f"panel {p['title']!r} overlaps another"
        cells |= cell


def test_dashboard_queries_only_metrics_the_code_defines(undefined_metrics):
    missing = undefined_metrics([t["expr"] for p in _panels() for t in p["targets"]])
    assert not missing, f"the dashboard queries metrics no module of app/ defines: {sorted(missing)}"


def test_runbook_queries_only_metrics_the_code_defines(undefined_metrics):
    runbook = (REPO / "docs" / "runbook.md").read_text()
    blocks = re.findall(r"```promql\n(.*?)```", runbook, flags=re.S)
    assert len(blocks) >= 5
    exprs = [line for block in blocks for line in block.splitlines() if line.strip() and not line.startswith("#")]
    missing = undefined_metrics(exprs)
    assert not missing, f"docs/runbook.md queries metrics no module of app/ defines: {sorted(missing)}"


def test_exporter_trouble_kinds_in_docs_and_dashboard_are_the_bridge_s():
    from app.bridge.health import TROUBLE_KINDS

    text = (REPO / "docs" / "runbook.md").read_text() + json.dumps(DASHBOARD)
    used = set()
    for selector in re.findall(r'rtt_bridge_exporter_trouble_total\{([^}]*)\}', text):
        for values in re.findall(r'kind=~?\\?"([^"\\]+)', selector):
            used |= set(values.split("|"))
    assert used and used <= set(TROUBLE_KINDS), f"unknown trouble kinds {sorted(used - set(TROUBLE_KINDS))}"


def test_compose_bridge_targets_load(tmp_path):
    from app.bridge.targets import load_targets

    mount = next(v for v in SERVICES["bridge"]["volumes"] if str(v).split(":")[1] == SERVICES["bridge"]["command"][2])
    (target,) = load_targets(REPO / str(mount).split(":")[0], environ={})
    hosts = {urlsplit(url).hostname for url in target.urls}
    assert hosts <= set(SERVICES), f"the bridge scrapes {hosts - set(SERVICES)}, which are no compose services"
