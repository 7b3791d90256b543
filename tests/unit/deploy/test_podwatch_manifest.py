"""k8s/podwatch.yaml: one `rttsched pods` writer that may read pods cluster-wide, and nothing more."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from app.extender.podwatch import PodWatchOptions

MANIFEST = Path(__file__).resolve().parents[3] / "k8s" / "podwatch.yaml"
DOCS = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def _one(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in DOCS if d["kind"] == kind]
    return doc


def _config() -> dict[str, Any]:
    docs = yaml.safe_load_all((MANIFEST.parent / "config.yaml").read_text())
    (doc,) = [d for d in docs if d and d["metadata"]["name"] == "rttsched-config"]
    return doc


def _deployment(manifest: str) -> dict[str, Any]:
    docs = yaml.safe_load_all((MANIFEST.parent / manifest).read_text())
    (doc,) = [d for d in docs if d and d["kind"] == "Deployment"]
    return doc


def test_one_replica_runs_rttsched_pods_under_its_own_service_account():
    dep = _one("Deployment")
    assert dep["spec"]["replicas"] == 1
    spec = dep["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["args"][0] == "pods"
    assert spec["serviceAccountName"] == _one("ServiceAccount")["metadata"]["name"]
    assert spec.get("automountServiceAccountToken", True) is True  # the in-cluster API access needs the token


def test_the_service_account_may_only_list_and_watch_pods():
    role, binding, account = _one("ClusterRole"), _one("ClusterRoleBinding"), _one("ServiceAccount")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": account["metadata"]["namespace"]}]


def test_the_resync_period_is_one_value_the_watcher_and_the_extender_share():
    (c,) = _one("Deployment")["spec"]["template"]["spec"]["containers"]
    assert "RTT_PODS_RESYNC_S" not in {e["name"] for e in c.get("env", [])}  # not overridden for the watcher only
    assert {"configMapRef": {"name": "rttsched-config"}} in c["envFrom"]
    shared = _config()["data"]
    options = PodWatchOptions(resync_s=float(shared["RTT_PODS_RESYNC_S"]))
    assert options.key_ttl_ms > 2 * 1000 * options.resync_s  # a view key outlives a missed resync or two
    (ext,) = _deployment("extender.yaml")["spec"]["template"]["spec"]["containers"]
    assert {"configMapRef": {"name": "rttsched-config"}} in ext["envFrom"]
    assert "RTT_PODS_RESYNC_S" not in {e["name"] for e in ext.get("env", [])}
