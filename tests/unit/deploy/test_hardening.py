"""Secrets, least privilege and network isolation in k8s/ and docker-compose.yml, read by parsing (no cluster).

* every container drops all capabilities, runs as non-root under the RuntimeDefault seccomp profile,
  cannot escalate and has a read-only root filesystem;
* Redis requires a password that only a Secret holds; the processes that use Redis read it from a
  mounted file; no ConfigMap holds a password; the Secret's source files are never committed;
* NetworkPolicies: ingress denied by default, the extender reachable only from the scheduler (and
  Prometheus), Redis only from the components that use it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from test_compose import SERVICES
from test_manifests import DOCS, _containers, _env_of, _find, _pod_specs, _where

REPO = Path(__file__).resolve().parents[3]
KUSTOMIZATION = yaml.safe_load((REPO / "k8s" / "kustomization.yaml").read_text())
REDIS_USERS = {"rttsched-worker", "rttsched-trainer", "rttsched-extender", "rttsched-pods", "rttsched-bridge"}


def _name(doc: dict[str, Any]) -> str:
    return str(doc["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"])


def _generated_secrets() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for gen in KUSTOMIZATION.get("secretGenerator", []):
        out[gen["name"]] = {f.split("=", 1)[0] for f in gen.get("files", [])}
    return out


def _ignored(path: str) -> bool:
    rules = [r.strip() for r in (REPO / ".gitignore").read_text().splitlines() if r.strip()]
    rel = "/" + path
    return any(rel.startswith(r.rstrip("*")) for r in rules if r.startswith("/"))


def test_every_container_drops_all_capabilities_and_runs_confined():
    for doc, spec in _pod_specs():
        pod_sc = spec.get("securityContext", {})
        for c in _containers(spec):
            sc = c.get("securityContext", {})
            where = _where(doc, c)
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], where
            seccomp = sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}
            assert seccomp.get("type") == "RuntimeDefault", where
            assert sc.get("allowPrivilegeEscalation") is False and sc.get("privileged") in (None, False), where
            assert sc.get("runAsNonRoot") is True and sc.get("readOnlyRootFilesystem") is True, where


def test_only_the_pods_that_call_the_api_server_mount_a_service_account_token():
    with_token = {_name(doc) for doc, spec in _pod_specs() if spec.get("automountServiceAccountToken", True)}
    assert with_token == {"rttsched-pods", "rtt-scheduler"}  # the pods watcher and kube-scheduler


def test_secrets_come_from_generated_secrets_whose_files_are_not_committed():
    generated = _generated_secrets()
    assert generated, "kustomization.yaml generates no Secret"
    for gen in KUSTOMIZATION["secretGenerator"]:
        for f in gen["files"]:
            path = "k8s/" + f.split("=", 1)[1]
            assert _ignored(path), f"{path} must be in .gitignore: secrets are never committed"
    for doc, spec in _pod_specs():
        for c in _containers(spec):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in generated.get(ref["name"], set()), (_where(doc, c), ref)
        for v in spec.get("volumes", []):
            if "secret" in v:
                keys = {i["key"] for i in v["secret"].get("items", [])}
                assert keys <= generated.get(v["secret"]["secretName"], set()), (_where(doc), v)


def test_no_configmap_holds_a_password():
    for doc in DOCS:
        if doc["kind"] != "ConfigMap":
            continue
        for key, value in doc.get("data", {}).items():
            assert "PASSWORD" not in key.upper() or key.upper().endswith("_FILE"), (doc["metadata"]["name"], key)
            if "://" in str(value):
                assert urlsplit(str(value)).password is None, (doc["metadata"]["name"], key)


def test_redis_requires_the_secret_password_and_its_users_read_it_from_a_mounted_file():
    redis = _find("Deployment", "rttsched-redis", "rttsched")
    assert redis is not None
    spec = redis["spec"]["template"]["spec"]
    c = spec["containers"][0]
    # the server reads the password from the Secret's file, as its users do (test_redis_password.py runs it)
    assert '--requirepass "$p"' in c["args"][0] and 'p="$(cat /etc/redis/secrets/redis-password)"' in c["args"][0]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volume = {v["name"]: v for v in spec["volumes"]}[next(n for n, p in mounts.items() if p == "/etc/redis/secrets")]
    assert volume["secret"]["secretName"] == "rttsched-secrets"
    assert {i["key"]: i["path"] for i in volume["secret"]["items"]} == {"redis-password": "redis-password"}
    # its data lives in the pod: a rollout replaces it, never runs two behind the Service
    assert redis["spec"]["strategy"] == {"type": "Recreate"}
    assert "env" not in c  # no copy of the password in the environment
    users = set()
    for doc, spec in _pod_specs():
        for container in spec["containers"]:
            env_values = _env_of(doc, container)
            path = env_values.get("RTT_REDIS_PASSWORD_FILE")
            if not path:
                continue
            users.add(_name(doc))
            mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            hits = [(n, p) for n, p in mounts.items() if path.startswith(p.rstrip("/") + "/")]
            assert hits, f"{_where(doc, container)}: {path} is not in a mounted volume"
            vol = volumes[hits[0][0]]
            item = path[len(hits[0][1].rstrip("/")) + 1:]
            assert "secret" in vol and item in {i["path"] for i in vol["secret"]["items"]}, _where(doc, container)
    assert users == REDIS_USERS


def _policies() -> list[dict[str, Any]]:
    return [d for d in DOCS if d["kind"] == "NetworkPolicy"]


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        if expr["operator"] == "In" and labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def _allowed_sources(target: str) -> tuple[set[str], set[str]]:
    """(in-namespace workloads, namespaces) that may reach ``target``'s pods, by every policy selecting them."""
    pods = {_name(doc): doc["spec"]["template"]["metadata"]["labels"] for doc, _ in _pod_specs()}
    names, namespaces = set(), set()
    for pol in _policies():
        if not _selects(pol["spec"]["podSelector"], pods[target]):
            continue
        for rule in pol["spec"].get("ingress", []):
            for peer in rule.get("from", []):
                if "namespaceSelector" in peer:
                    namespaces.add(peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"])
                elif "podSelector" in peer:
                    names |= {n for n, labels in pods.items() if _selects(peer["podSelector"], labels)}
    return names, namespaces


def test_ingress_is_denied_by_default_and_allowed_only_where_needed():
    deny = [p for p in _policies() if p["spec"]["podSelector"] == {} and "ingress" not in p["spec"]]
    assert deny and deny[0]["spec"]["policyTypes"] == ["Ingress"]
    assert _allowed_sources("rttsched-extender") == ({"rtt-scheduler"}, {"monitoring"})
    assert _allowed_sources("rttsched-redis") == (REDIS_USERS, set())
    assert _allowed_sources("rttsched-worker") == (set(), {"monitoring"})


def test_compose_drops_capabilities_and_protects_redis_with_a_secret_file():
    for name, svc in SERVICES.items():
        if name in ("redis", "topics") or "build" in svc:
            assert svc.get("cap_drop") == ["ALL"], name
            assert "no-new-privileges:true" in svc.get("security_opt", []), name
            assert svc.get("read_only") is True, name
    redis = SERVICES["redis"]
    assert "--requirepass" in " ".join(redis["command"]) and "redis-password" in redis["secrets"]
    assert "/run/secrets/redis-password" in " ".join(redis["healthcheck"]["test"])
    for name in ("worker", "trainer", "extender"):
        svc = SERVICES[name]
        assert "redis-password" in svc["secrets"], name
        assert svc["environment"]["RTT_REDIS_PASSWORD_FILE"] == "/run/secrets/redis-password", name
        assert urlsplit(svc["environment"]["REDIS_URL"]).password is None, name
    from test_compose import COMPOSE

    source = COMPOSE["secrets"]["redis-password"]["file"]
    assert _ignored(source.removeprefix("./")), f"{source} must be in .gitignore"
