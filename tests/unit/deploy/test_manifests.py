"""The Kubernetes manifests of k8s/ hang together: names, ports, keys, images, commands and settings.

No cluster is needed: every manifest is parsed with PyYAML and its cross-references are resolved
against the other manifests, the CLI and the settings of the code.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

REPO = Path(__file__).resolve().parents[3]
K8S = REPO / "k8s"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass"}
BUILTIN_ROLES = {("kube-system", "extension-apiserver-authentication-reader")}
BUILTIN_CLUSTER_ROLES = {"system:kube-scheduler", "system:volume-scheduler"}
WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet", "Job"}
UNITS = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}


DOCS = [{**doc, "_file": path.name} for path in sorted(K8S.glob("*.yaml")) if path.name != "kustomization.yaml"
        for doc in yaml.safe_load_all(path.read_text()) if doc]


def _ns(doc: dict[str, Any]) -> str | None:
    return doc["metadata"].get("namespace")


def _find(kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
    for doc in DOCS:
        if doc["kind"] == kind and doc["metadata"]["name"] == name and (namespace is None or _ns(doc) == namespace):
            return doc
    return None


def _pod_specs() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for doc in DOCS:
        if doc["kind"] in WORKLOADS:
            yield doc, doc["spec"]["template"]["spec"]


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def _all_containers() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    yield from ((doc, c) for doc, spec in _pod_specs() for c in _containers(spec))


def _where(doc: dict[str, Any], c: dict[str, Any] | None = None) -> str:
    return f"{doc['_file']}: {doc['kind']}/{doc['metadata']['name']}" + (f" container {c['name']}" if c else "")


def _configmap_data(name: str, namespace: str | None) -> dict[str, str]:
    cm = _find("ConfigMap", name, namespace)
    assert cm is not None, f"ConfigMap {namespace}/{name} is referenced but not defined in k8s/"
    return dict(cm.get("data", {}))


def _env_of(doc: dict[str, Any], c: dict[str, Any]) -> dict[str, str | None]:
    """Environment a container gets (envFrom ConfigMaps, then env); None for values from fieldRef etc."""
    env: dict[str, str | None] = {}
    for src in c.get("envFrom", []):
        env.update(_configmap_data(src["configMapRef"]["name"], _ns(doc)))
    for e in c.get("env", []):
        ref = e.get("valueFrom", {}).get("configMapKeyRef")
        env[e["name"]] = _configmap_data(ref["name"], _ns(doc)).get(ref["key"]) if ref else e.get("value")
    return env


def _quantity(q: str | int | float) -> float:
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(q))
    assert m and m.group(2) in ("", *UNITS), f"bad quantity {q!r}"
    return float(m.group(1)) * UNITS.get(m.group(2), 1.0)


def test_worker_replicas_fit_the_partition_count():
    from app.contracts import load_contracts

    dep = _find("Deployment", "rttsched-worker")
    assert dep and 1 <= dep["spec"]["replicas"] <= load_contracts()["node-metrics"].partitions


def test_kustomization_lists_every_manifest_once(project_image, project_version):
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = kust["resources"]
    assert len(listed) == len(set(listed))
    assert set(listed) == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert [i["newTag"] for i in kust["images"] if i["name"] == project_image.split(":")[0]] == [project_version]


def test_every_namespaced_object_names_an_existing_namespace():
    namespaces = {d["metadata"]["name"] for d in DOCS if d["kind"] == "Namespace"} | {"kube-system"}
    for doc in DOCS:
        if doc["kind"] in CLUSTER_SCOPED:
            assert _ns(doc) is None, _where(doc)
        else:
            assert _ns(doc) in namespaces, f"{_where(doc)}: namespace {_ns(doc)!r}"


def test_configmap_references_resolve_to_existing_keys():
    for doc, spec in _pod_specs():
        for c in _containers(spec):
            for src in c.get("envFrom", []):
                _configmap_data(src["configMapRef"]["name"], _ns(doc))
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("configMapKeyRef")
                if ref:
                    assert ref["key"] in _configmap_data(ref["name"], _ns(doc)), f"{_where(doc, c)}: {ref}"
            mounted = {v["name"] for v in spec.get("volumes", [])}
            for m in c.get("volumeMounts", []):
                assert m["name"] in mounted, f"{_where(doc, c)} mounts unknown volume {m['name']}"
        for vol in spec.get("volumes", []):
            if "configMap" in vol:
                data = _configmap_data(vol["configMap"]["name"], _ns(doc))
                for item in vol["configMap"].get("items", []):
                    assert item["key"] in data, f"{_where(doc)}: volume {vol['name']} key {item['key']}"


def test_service_accounts_and_role_references_exist():
    for doc, spec in _pod_specs():
        if "serviceAccountName" in spec:
            assert _find("ServiceAccount", spec["serviceAccountName"], _ns(doc)), _where(doc)
    for doc in DOCS:
        if doc["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        for s in doc["subjects"]:
            assert s["kind"] == "ServiceAccount" and _find("ServiceAccount", s["name"], s["namespace"]), _where(doc)
        ref = doc["roleRef"]
        if ref["kind"] == "ClusterRole":
            assert ref["name"] in BUILTIN_CLUSTER_ROLES or _find("ClusterRole", ref["name"]), _where(doc)
        else:
            assert (_ns(doc), ref["name"]) in BUILTIN_ROLES or _find("Role", ref["name"], _ns(doc)), _where(doc)


def test_images_are_the_project_image_or_pinned_third_party(project_image, is_third_party):
    seen = set()
    for doc, c in _all_containers():
        image = c["image"]
        if is_third_party(image):
            tag = image.rsplit(":", 1)[-1] if ":" in image else ""
            assert tag and tag != "latest", f"{_where(doc, c)}: unpinned {image}"
        else:
            seen.add(image)
    assert seen == {project_image}


def test_every_container_has_cpu_and_memory_requests_and_limits():
    for doc, c in _all_containers():
        res = c.get("resources", {})
        for kind in ("cpu", "memory"):
            req, lim = res.get("requests", {}).get(kind), res.get("limits", {}).get(kind)
            assert req is not None and lim is not None, f"{_where(doc, c)}: {kind} request and limit"
            assert _quantity(req) <= _quantity(lim), f"{_where(doc, c)}: {kind} request {req} > limit {lim}"


def test_project_containers_run_existing_cli_commands(check_cli, project_image, entrypoint):
    for doc, c in _all_containers():
        if c["image"] == project_image:
            argv = list(c.get("command") or entrypoint) + list(c.get("args", []))
            assert check_cli(argv) is None, f"{_where(doc, c)}: {check_cli(argv)}"


def test_every_setting_a_manifest_sets_exists(known_env, project_image):
    unknown = set()
    for doc, c in _all_containers():
        if c["image"] == project_image:
            unknown |= {n for n in _env_of(doc, c) if (n.startswith("RTT_") or n == "REDIS_URL") and n not in known_env}
    for doc in DOCS:
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "rttsched-config":
            unknown |= set(doc["data"]) - known_env
    assert not unknown, f"settings unknown to app/config.py Settings: {sorted(unknown)}"


def test_probes_and_scrape_annotations_point_at_declared_ports():
    for doc, spec in _pod_specs():
        annotations = doc["spec"]["template"]["metadata"].get("annotations", {})
        ports = {p.get("name"): p["containerPort"] for c in spec["containers"] for p in c.get("ports", [])}
        for c in spec["containers"]:
            for probe in ("livenessProbe", "readinessProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if port is not None:
                    assert port in ports or port in ports.values(), f"{_where(doc, c)}: {probe} port {port}"
        if annotations.get("prometheus.io/scrape") == "true":
            port = int(annotations["prometheus.io/port"])
            assert port in ports.values(), f"{_where(doc)}: scrape port {port} not a container port"
            env = _env_of(doc, spec["containers"][0])
            assert port == int(env.get("RTT_METRICS_PORT") or env.get("RTT_EXTENDER_PORT") or -1), _where(doc)


def _selected_pods(service: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    sel = service["spec"]["selector"]
    return [(d, s) for d, s in _pod_specs() if _ns(d) == _ns(service)
            and sel.items() <= d["spec"]["template"]["metadata"]["labels"].items()]


def test_services_select_pods_that_serve_their_target_ports():
    for svc in (d for d in DOCS if d["kind"] == "Service"):
        pods = _selected_pods(svc)
        assert pods, f"{_where(svc)} selects no pods"
        for port in svc["spec"]["ports"]:
            for doc, spec in pods:
                declared = [p for c in spec["containers"] for p in c.get("ports", [])]
                assert any(port["targetPort"] in (p.get("name"), p["containerPort"]) for p in declared), (
                    f"{_where(svc)} port {port['port']} -> {port['targetPort']} not served by {_where(doc)}")


def _scheduler_config() -> dict[str, Any]:
    cm = _find("ConfigMap", "rtt-scheduler-config")
    assert cm is not None
    return yaml.safe_load(cm["data"]["scheduler-config.yaml"])


def test_scheduler_config_reaches_the_extender_service_and_container_port():
    cfg = _scheduler_config()
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1" and cfg["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in cfg["profiles"]] == ["rtt-scheduler"]
    # every feasible node reaches the extender: the default stops at an adaptive share above 100 nodes
    assert cfg["percentageOfNodesToScore"] == 100
    assert all(p.get("percentageOfNodesToScore", 100) == 100 for p in cfg["profiles"])
    (ext,) = cfg["extenders"]
    assert ext["filterVerb"] == "filter" and ext["prioritizeVerb"] == "prioritize"
    assert ext["nodeCacheCapable"] is True and ext["enableHTTPS"] is False and isinstance(ext["ignorable"], bool)
    assert re.fullmatch(r"\d+(ms|s)", ext["httpTimeout"]) and 1 <= ext["weight"] <= 100
    url = urlsplit(ext["urlPrefix"])
    assert url.scheme == "http"
    svc_name, svc_ns, suffix = url.hostname.split(".", 2)
    assert suffix in ("svc", "svc.cluster.local")
    svc = _find("Service", svc_name, svc_ns)
    assert svc is not None, f"extender Service {svc_ns}/{svc_name} is not defined"
    # each replica keeps its own assumed pods (anti-affinity, pending pods): the scheduler's calls stay on one
    dep = _find("Deployment", svc_name, svc_ns)
    if dep is not None and dep["spec"].get("replicas", 1) > 1:
        assert svc["spec"].get("sessionAffinity") == "ClientIP", "extender replicas would each see part of the pods"
    (port,) = [p for p in svc["spec"]["ports"] if p["port"] == url.port]
    for doc, spec in _selected_pods(svc):
        (c,) = spec["containers"]
        (cport,) = [p["containerPort"] for p in c["ports"] if port["targetPort"] in (p.get("name"), p["containerPort"])]
        assert int(_env_of(doc, c)["RTT_EXTENDER_PORT"] or -1) == cport, "extender listens on another port"


def test_second_scheduler_reads_its_config_and_owns_its_lease():
    cfg = _scheduler_config()
    dep = _find("Deployment", "rtt-scheduler")
    assert dep is not None
    spec = dep["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["image"].startswith("registry.k8s.io/kube-scheduler:v1.")
    (flag,) = [a for a in c["command"] if a.startswith("--config=")]
    config_path = Path(flag.removeprefix("--config="))
    mount = next(m for m in c["volumeMounts"] if Path(m["mountPath"]) == config_path.parent)
    vol = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert vol["configMap"]["name"] == "rtt-scheduler-config" and config_path.name == "scheduler-config.yaml"
    election = cfg["leaderElection"]
    role = _find("Role", "rtt-scheduler-leader-election", election["resourceNamespace"])
    assert role is not None and any(election["resourceName"] in r.get("resourceNames", []) for r in role["rules"])
    for name in ("rtt-scheduler-as-kube-scheduler", "rtt-scheduler-as-volume-scheduler"):
        binding = _find("ClusterRoleBinding", name)
        assert binding and binding["subjects"][0]["name"] == spec["serviceAccountName"]


def test_bridge_runs_on_every_node_with_its_node_name_and_targets():
    ds = _find("DaemonSet", "rttsched-bridge")
    assert ds is not None
    spec = ds["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert {"operator": "Exists"} in spec["tolerations"]
    targets_path = c["args"][c["args"].index("--targets") + 1]
    assert targets_path in {m["mountPath"] for m in c["volumeMounts"]}
    text = _configmap_data("rttsched-bridge-targets", "rttsched")[Path(targets_path).name]
    placeholders = set(re.findall(r"\$\{(\w+)\}", text))
    assert placeholders <= set(env), f"targets use variables the pod does not set: {placeholders - set(env)}"


def test_bridge_targets_load_with_the_pod_environment(tmp_path):
    from app.bridge.targets import load_targets

    path = tmp_path / "targets.yaml"
    path.write_text(_configmap_data("rttsched-bridge-targets", "rttsched")["targets.yaml"])
    (target,) = load_targets(path, environ={"NODE_NAME": "gpu-node-1", "NODE_IP": "10.0.0.7"})
    assert target.node == "gpu-node-1"
    assert {e.port for e in target.endpoints if not e.optional} == {9100}
    assert set(target.urls) == {f"http://10.0.0.7:{p}/metrics" for p in (9100, 9400, 9835)}


def test_extender_policy_is_valid_and_the_same_as_compose_s():
    from app.scheduler.policy import policy_from_dict

    in_k8s = policy_from_dict(yaml.safe_load(_configmap_data("rttsched-extender-policy", "rttsched")["policy.yaml"]))
    assert in_k8s.sla_ms and not in_k8s.anti_affinity  # anti-affinity pairs are an operator's choice, off
    compose_copy = REPO / "deploy" / "extender" / "policy.yaml"
    assert policy_from_dict(yaml.safe_load(compose_copy.read_text())) == in_k8s
    commented = [line[1:].split("#")[0] for line in compose_copy.read_text().splitlines() if line.startswith("#   - [")]
    assert policy_from_dict({"anti_affinity": yaml.safe_load("\n".join(commented))}).anti_affinity  # a valid example


def test_every_container_with_the_shared_settings_mounts_the_optional_kafka_secret():
    """Each process checks every Kafka file setting of rttsched-config at start: all seven containers that get it
    must see the same files, and a pod of a PLAINTEXT deployment must start without the Secret."""
    with_settings = [(doc, spec, c) for doc, spec in _pod_specs() for c in _containers(spec)
                     if any(s.get("configMapRef", {}).get("name") == "rttsched-config" for s in c.get("envFrom", []))]
    assert len(with_settings) == 7, [_where(doc, c) for doc, _, c in with_settings]
    for doc, spec, c in with_settings:
        mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
        assert mounts.get("kafka", {}).get("mountPath") == "/etc/rttsched/kafka", _where(doc, c)
        assert mounts["kafka"].get("readOnly") is True, _where(doc, c)
        volume = {v["name"]: v for v in spec["volumes"]}["kafka"]["secret"]
        assert volume == {"secretName": "rttsched-kafka", "optional": True, "defaultMode": 0o440}, _where(doc)
        assert spec.get("securityContext", {}).get("fsGroup") == 10001, _where(doc)  # the image's user reads 0440


def test_kustomization_comments_name_only_secrets_and_keys_the_pods_mount():
    """What the comments tell an operator to add to a Secret must reach a container: a key of a generated Secret
    that no volume projects, or a Secret no pod mounts, is read by nothing."""
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    comments = "\n".join(line for line in (K8S / "kustomization.yaml").read_text().splitlines()
                         if line.lstrip().startswith("#"))
    volumes = [v["secret"] for _, spec in _pod_specs() for v in spec.get("volumes", []) if "secret" in v]
    mounted = {v["secretName"] for v in volumes}
    for gen in kust["secretGenerator"]:
        keys = {i["key"] for v in volumes if v["secretName"] == gen["name"] for i in v.get("items", [])}
        for key in re.findall(r"([\w.-]+)=secrets/", comments):
            assert key in keys, f"kustomization.yaml says to add {key!r} to {gen['name']}, which no volume mounts"
    named = set(re.findall(r"\brttsched-[a-z-]*[a-z]\b", comments)) - {"rttsched-config"}
    assert named and named <= mounted, f"Secrets the comments name that no pod mounts: {named - mounted}"


def test_no_container_sets_again_what_it_gets_from_its_configmap():
    """A key of an envFrom ConfigMap that the container's env also sets is dead in the ConfigMap: editing it there
    changes nothing (the env wins), so it must not be there to be edited."""
    for doc, c in _all_containers():
        shared = {k for src in c.get("envFrom", []) for k in _configmap_data(src["configMapRef"]["name"], _ns(doc))}
        again = shared & {e["name"] for e in c.get("env", [])}
        assert not again, f"{_where(doc, c)} sets {sorted(again)} beside envFrom"


def test_the_image_exposes_every_port_its_containers_serve(project_image):
    exposed = {int(p) for line in (REPO / "deploy" / "Dockerfile").read_text().splitlines()
               if line.startswith("EXPOSE ") for p in line.split()[1:]}
    served = {p["containerPort"] for _, c in _all_containers() if c["image"] == project_image
              for p in c.get("ports", [])}
    assert served and served <= exposed, f"deploy/Dockerfile does not EXPOSE {sorted(served - exposed)}"
