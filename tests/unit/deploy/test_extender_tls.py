"""The kustomize component k8s/optional/extender-tls turns the extender and its callers to HTTPS, completely.

Its patches are JSON patches (RFC 6902), applied here in Python to the objects of k8s/ and k8s/optional (as
``kubectl kustomize`` applies them to an overlay with the component), so no kubectl is needed; every patch must
find its object, every ``test`` op must hold. What the result must show: the extender's probes on HTTPS, its
certificate and key mounted from one Secret at the paths RTT_EXTENDER_TLS_CERT / RTT_EXTENDER_TLS_KEY name,
kube-scheduler calling https:// and checking the certificate against a CA file its pod mounts, and the extender
scraped over HTTPS, by the annotations and by the PodMonitor.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
K8S = REPO / "k8s"
COMPONENT = K8S / "optional" / "extender-tls"


def _load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _objects() -> list[dict[str, Any]]:
    """The objects an overlay of k8s/ and k8s/optional builds (each kustomization's resources, in order)."""
    out = []
    for root in (K8S, K8S / "optional"):
        kust = yaml.safe_load((root / "kustomization.yaml").read_text())
        out += [d for name in kust["resources"] for d in _load(root / name)]
    return out


def _pointer(path: str) -> list[str]:
    assert path.startswith("/"), path
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _apply(doc: Any, op: dict[str, Any]) -> None:
    """One RFC 6902 operation (add, replace, remove, test) on ``doc``, in place; AssertionError where kustomize
    would refuse it (a missing parent or key, a failed test)."""
    *parents, last = _pointer(op["path"])
    node = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if op["op"] == "test":
        got = node[int(last)] if isinstance(node, list) else node.get(last)
        assert got == op["value"], f"test {op['path']}: {got!r} is not {op['value']!r}"
    elif op["op"] == "add":
        if isinstance(node, list):
            node.insert(len(node) if last == "-" else int(last), copy.deepcopy(op["value"]))
        else:
            node[last] = copy.deepcopy(op["value"])
    elif op["op"] == "replace":
        assert (int(last) < len(node)) if isinstance(node, list) else (last in node), f"replace {op['path']}: absent"
        node[int(last) if isinstance(node, list) else last] = copy.deepcopy(op["value"])
    elif op["op"] == "remove":
        del node[int(last) if isinstance(node, list) else last]
    else:
        raise AssertionError(f"op {op['op']!r} is not applied here")


def _matches(doc: dict[str, Any], target: dict[str, str]) -> bool:
    group, _, version = doc["apiVersion"].rpartition("/")
    return (doc["kind"] == target["kind"] and doc["metadata"]["name"] == target["name"]
            and doc["metadata"].get("namespace") == target.get("namespace", doc["metadata"].get("namespace"))
            and group == target.get("group", group) and version == target.get("version", version))


def render() -> list[dict[str, Any]]:
    """k8s/ and k8s/optional with the component's patches applied; each patch's target must be there, once."""
    comp = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    assert comp["kind"] == "Component" and comp["apiVersion"] == "kustomize.config.k8s.io/v1alpha1"
    assert set(comp) <= {"apiVersion", "kind", "patches"}, "only patches are applied here"
    docs = copy.deepcopy(_objects())
    for patch in comp["patches"]:
        (doc,) = [d for d in docs if _matches(d, patch["target"])] or [None]
        assert doc is not None, f"{patch['path']}: target {patch['target']} is not in k8s/ or k8s/optional"
        ops = yaml.safe_load((COMPONENT / patch["path"]).read_text())
        assert isinstance(ops, list) and ops, f"{patch['path']} is no JSON patch"
        for op in ops:
            _apply(doc, op)
    return docs


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return render()


def _get(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _file_in(spec: dict[str, Any], container: dict[str, Any], path: str) -> tuple[str, str]:
    """(Secret, key) of the file ``path`` in ``container``: a Secret volume's item under one of its mounts."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in container.get("volumeMounts", []):
        secret = volumes[mount["name"]].get("secret")
        if secret is None or "subPath" in mount:
            continue
        for item in secret.get("items", []):
            if str(Path(mount["mountPath"]) / item["path"]) == path:
                return secret["secretName"], item["key"]
    raise AssertionError(f"{container['name']} mounts no Secret key at {path}")


def _scheduler_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(yaml.safe_load(_get(docs, "ConfigMap", "rtt-scheduler-config")["data"]["scheduler-config.yaml"]))


def test_the_extender_serves_https_with_a_secret_mounted_where_its_settings_say(rendered):
    dep = _get(rendered, "Deployment", "rttsched-extender")
    spec = dep["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    cert = _file_in(spec, c, env["RTT_EXTENDER_TLS_CERT"])
    key = _file_in(spec, c, env["RTT_EXTENDER_TLS_KEY"])
    assert cert[0] == key[0] == "rttsched-extender-tls" and (cert[1], key[1]) == ("tls.crt", "tls.key")
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"].get("scheme") == "HTTPS", f"{probe} speaks plain HTTP to the TLS port"
    assert dep["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scheme"] == "https"


def test_the_settings_the_component_sets_start_the_extender_on_https(rendered, tmp_path):
    """The two variables are the ones the settings read (both set: HTTPS), with no other TLS setting left out."""
    from app.config import Settings

    (c,) = _get(rendered, "Deployment", "rttsched-extender")["spec"]["template"]["spec"]["containers"]
    tls = {e["name"]: e["value"] for e in c["env"] if e["name"].startswith("RTT_EXTENDER_TLS")}
    assert set(tls) == {"RTT_EXTENDER_TLS_CERT", "RTT_EXTENDER_TLS_KEY"}
    settings = Settings.from_env(tls)
    assert (settings.extender_tls_cert, settings.extender_tls_key) == (tls["RTT_EXTENDER_TLS_CERT"],
                                                                         tls["RTT_EXTENDER_TLS_KEY"])


def test_kube_scheduler_calls_https_and_checks_the_certificate_against_a_ca_it_mounts(rendered):
    cfg = _scheduler_config(rendered)
    (ext,) = cfg["extenders"]
    url = urlsplit(ext["urlPrefix"])
    assert url.scheme == "https" and ext["enableHTTPS"] is True
    tls = ext["tlsConfig"]
    assert tls["serverName"] == url.hostname and not tls.get("insecure", False)
    spec = _get(rendered, "Deployment", "rtt-scheduler")["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert _file_in(spec, c, tls["caFile"]) == ("rttsched-extender-tls", "ca.crt")


def test_the_https_scheduler_config_differs_from_k8s_s_only_in_its_tls_settings(rendered):
    """The component replaces the whole config text: anything else in it must stay as k8s/scheduler.yaml says."""
    base, tls = _scheduler_config(_objects()), _scheduler_config(rendered)
    base_ext, tls_ext = base.pop("extenders")[0], tls.pop("extenders")[0]
    assert base == tls
    assert urlsplit(tls_ext.pop("urlPrefix"))._replace(scheme="http").geturl() == base_ext.pop("urlPrefix")
    del tls_ext["tlsConfig"]
    assert (tls_ext.pop("enableHTTPS"), base_ext.pop("enableHTTPS")) == (True, False)
    assert tls_ext == base_ext


def test_the_pod_monitor_scrapes_the_extender_over_https_and_the_others_as_before(rendered):
    before = _get(_objects(), "PodMonitor", "rttsched")["spec"]["podMetricsEndpoints"]
    after = _get(rendered, "PodMonitor", "rttsched")["spec"]["podMetricsEndpoints"]
    (extender_port,) = [p for c in _get(rendered, "Deployment", "rttsched-extender")["spec"]["template"]["spec"]
                        ["containers"] for p in c["ports"]]
    (ext,) = [e for e in after if e["port"] == extender_port["name"]]
    assert ext["scheme"] == "https"
    assert ext["tlsConfig"]["ca"]["secret"] == {"name": "rttsched-extender-tls", "key": "ca.crt"}
    url = urlsplit(_scheduler_config(rendered)["extenders"][0]["urlPrefix"])
    assert ext["tlsConfig"]["serverName"] == url.hostname
    assert [e for e in after if e is not ext] == [e for e in before if e["port"] != extender_port["name"]]


def test_the_component_changes_nothing_but_the_extender_its_scheduler_and_their_scrape(rendered):
    changed = {(d["kind"], d["metadata"]["name"]) for d, b in zip(rendered, _objects(), strict=True) if d != b}
    assert changed == {("Deployment", "rttsched-extender"), ("Deployment", "rtt-scheduler"),
                       ("ConfigMap", "rtt-scheduler-config"), ("PodMonitor", "rttsched")}


def test_a_json_patch_test_that_fails_is_refused():
    """The renderer refuses what kustomize refuses: a failed ``test`` op (the component's guard on container 0)."""
    doc = {"spec": {"containers": [{"name": "other"}]}}
    with pytest.raises(AssertionError):
        _apply(doc, {"op": "test", "path": "/spec/containers/0/name", "value": "extender"})
