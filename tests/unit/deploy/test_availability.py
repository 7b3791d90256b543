"""What keeps the deployment placing pods through rollouts, drains and full memory, read from k8s/ and
docker-compose.yml (no cluster, no Docker):

* a pod behind a Service kube-scheduler calls keeps answering after SIGTERM until kube-proxy stops sending it
  calls (preStop), and its grace period covers that and its own stop;
* the second scheduler survives a drain (PodDisruptionBudget, replicas on two nodes) and a full cluster (a
  PriorityClass that its namespace may use);
* each compose service gets the stop time its process needs (Docker's default is 10 s);
* Redis refuses writes when full instead of being OOM-killed;
* the trainer holds a model key for each app the workers track on each node class, and its memory limit holds
  what its sample history may hold at its caps, plus a retrain.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
import yaml
from test_compose import SERVICES, _env
from test_manifests import DOCS, _env_of, _find, _quantity, _selected_pods

from app.config import Settings

REPO = Path(__file__).resolve().parents[3]
# the extender's stop after SIGTERM: about 3 s measured; bounded by its publisher's drain of the predictions it
# holds (5 s) and the clients' close
EXTENDER_STOP_S = 8
# kube-proxy on every node must see the endpoint's removal before the listener closes (a few seconds)
MIN_PRESTOP_S = 5
# classes that some clusters admit only in kube-system (a ResourceQuota on them elsewhere, as GKE's)
SYSTEM_CLASSES = {"system-cluster-critical", "system-node-critical"}
# The trainer's memory, measured (docs/deploy.md, Trainer memory): each held sample costs its feature row
# (counted below from the code) plus ~430 bytes of Python objects (the row's tuple and array header, two
# floats, its task id, the deque and set slots); a retrain over a full key of ~290 features peaked 229 MB above
# the history, the idle process is 145 MB.
ROW_OVERHEAD_BYTES = 450
METRIC_FEATURES = 57 * 5 + 8  # the bridge's canonical metrics x aggregates, + hardware and task columns
NODE_CLASSES = ("cpu", "gpu")  # a model key is app x node class
RETRAIN_PEAK_BYTES = 256 * 2**20
PROCESS_BYTES = 160 * 2**20
HEADROOM = 0.10             # of the limit, left over (fragmentation, Kafka fetch buffers, a larger retrain)


def _scheduler_config() -> dict[str, Any]:
    cm = _find("ConfigMap", "rtt-scheduler-config")
    assert cm is not None
    return dict(yaml.safe_load(cm["data"]["scheduler-config.yaml"]))


def _called_by_the_scheduler() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The workloads behind every Service a urlPrefix of the scheduler's extenders names."""
    out = []
    for ext in _scheduler_config()["extenders"]:
        name, namespace = str(urlsplit(ext["urlPrefix"]).hostname).split(".")[:2]
        svc = _find("Service", name, namespace)
        assert svc is not None, ext["urlPrefix"]
        out += _selected_pods(svc)
    assert out
    return out


def test_what_the_scheduler_calls_keeps_answering_until_kube_proxy_stops_sending_it_calls():
    for doc, spec in _called_by_the_scheduler():
        for c in spec["containers"]:
            command = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
            assert command and command[0] == "sleep", f"{doc['metadata']['name']}: no preStop sleep"
            sleep_s = float(command[1])
            assert sleep_s >= MIN_PRESTOP_S
            # the grace period counts from the preStop hook's start: the sleep and then the process's own stop
            grace = spec.get("terminationGracePeriodSeconds", 30)
            assert grace >= sleep_s + EXTENDER_STOP_S, f"{doc['metadata']['name']}: grace {grace} s"


def test_the_prestop_sleep_is_a_program_of_the_image():
    """exec runs in the container: ``sleep`` must be in the image (Debian's coreutils in python:*-slim)."""
    bases = [line.split()[1] for line in (REPO / "deploy" / "Dockerfile").read_text().splitlines()
             if line.startswith("FROM ")]
    assert re.fullmatch(r"python:3\.\d+-slim(-\w+)?", bases[-1]), bases


def test_the_second_scheduler_outlives_a_drain_and_a_full_cluster():
    dep = _find("Deployment", "rtt-scheduler", "rttsched")
    assert dep is not None and dep["spec"]["replicas"] >= 2
    labels = dep["spec"]["template"]["metadata"]["labels"]
    spec = dep["spec"]["template"]["spec"]
    pdbs = [d for d in DOCS if d["kind"] == "PodDisruptionBudget" and d["metadata"]["namespace"] == "rttsched"
            and d["spec"]["selector"]["matchLabels"].items() <= labels.items()]
    assert [p["spec"] for p in pdbs] == [{"minAvailable": 1, "selector": pdbs[0]["spec"]["selector"]}]
    (term,) = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()
    cls = spec["priorityClassName"]
    assert cls not in SYSTEM_CLASSES or dep["metadata"]["namespace"] == "kube-system"
    pc = _find("PriorityClass", cls)
    assert pc is not None and pc["globalDefault"] is False and 0 < pc["value"] <= 1_000_000_000


def _duration_s(text: str) -> float:
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"bad duration {text!r}"
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3}[u] for n, u in parts)


def _compose_stop_s(name: str) -> float:
    return _duration_s(SERVICES[name]["stop_grace_period"]) if "stop_grace_period" in SERVICES[name] else 10.0


@pytest.mark.parametrize(("service", "deployment", "needs_s"), [
    ("worker", "rttsched-worker", 30.0),   # --stop-timeout-s (app.streams.shutdown.DEFAULT_STOP_TIMEOUT_S)
    ("trainer", "rttsched-trainer", 30.0),  # a retrain under way ends first
    ("extender", "rttsched-extender", EXTENDER_STOP_S),
    ("bridge", "rttsched-bridge", 5.0),    # docs/bridge.md: within 5 s of the signal
])
def test_compose_gives_each_component_the_stop_time_it_needs(service, deployment, needs_s):
    from app.streams.shutdown import DEFAULT_STOP_TIMEOUT_S

    needs = max(needs_s, DEFAULT_STOP_TIMEOUT_S + 5.0) if service == "worker" else needs_s
    assert _compose_stop_s(service) >= needs, f"{service}: {_compose_stop_s(service)} s to stop"
    doc = _find("Deployment", deployment) or _find("DaemonSet", deployment)
    assert doc is not None
    spec = doc["spec"]["template"]["spec"]
    hook = spec["containers"][0].get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
    assert spec.get("terminationGracePeriodSeconds", 30) - (float(hook[1]) if hook else 0.0) >= needs


def _redis_flags(command: str) -> dict[str, str]:
    words = command.split()
    return {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--maxmemory")}


def test_redis_refuses_writes_when_full_below_its_memory_limit():
    dep = _find("Deployment", "rttsched-redis")
    assert dep is not None
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    compose = SERVICES["redis"]
    k8s_limit = _quantity(c["resources"]["limits"]["memory"])
    for where, command, limit in (("k8s/redis.yaml", " ".join(c["args"]), k8s_limit),
                                  ("docker-compose.yml", compose["command"][-1], _compose_bytes(compose["mem_limit"]))):
        flags = _redis_flags(command)
        assert flags.get("--maxmemory-policy") == "noeviction", f"{where}: models must not be evicted"
        maxmemory = _redis_bytes(flags["--maxmemory"])
        # the save's fork (copy-on-write), client buffers and fragmentation live above maxmemory
        assert 0 < maxmemory <= 0.8 * limit, f"{where}: maxmemory {flags['--maxmemory']} under a {limit:.0f} limit"


def _redis_bytes(text: str) -> float:
    m = re.fullmatch(r"(\d+)(b|kb|mb|gb)?", text.lower())
    assert m, text
    return int(m.group(1)) * {"b": 1, "kb": 1024, "mb": 2**20, "gb": 2**30, None: 1}[m.group(2)]


def _compose_bytes(text: str) -> float:
    m = re.fullmatch(r"(\d+)([bkmg])?", str(text).lower())
    assert m, text
    return int(m.group(1)) * {"b": 1, "k": 2**10, "m": 2**20, "g": 2**30, None: 1}[m.group(2)]


def _bytes_per_sample(features: int) -> float:
    """A held sample's bytes at ``features`` columns: its feature row as the history stores it (counted by the code),
    plus the objects around it (measured)."""
    from app.trainer.history import SampleHistory

    history = SampleHistory(max_per_key=200)
    rng = np.random.default_rng(0)
    for i in range(200):
        values = {f"m{j}__mean": float(v) for j, v in enumerate(rng.uniform(0, 100, features - 4))}
        history.add({"model_key": "gCTF:gpu", "task_id": f"t{i}", "node_class": "gpu", "gpu_model": "Tesla M40",
                     "started_ts": 1.0 + i, "rtt_ms": 100.0, "input_size_mb": 64.0, "features": values})
    (names, _rows) = history.snapshot("gCTF:gpu")
    assert abs(len(names) - features) <= 4, len(names)
    return history.nbytes / len(history) + ROW_OVERHEAD_BYTES


def _settings(env: dict[str, str]) -> Settings:
    """The trainer's and the worker's settings of ``env`` (not those naming files of the container)."""
    return Settings.from_env({k: v for k, v in env.items()
                              if k.startswith(("RTT_TRAINER_", "RTT_WORKER_", "RTT_FEATURE_"))})


def _trainer_needs(trainer_env: dict[str, str], worker_env: dict[str, str]) -> float:
    """The trainer's memory at its caps: every key full, each sample with the metric columns and a
    ``running_pods_<app>`` column for each app the workers track (``RTT_WORKER_MAX_APPS`` as the workers run)."""
    settings = _settings(trainer_env)
    features = METRIC_FEATURES + _settings(worker_env).worker_max_apps
    held = settings.trainer_max_keys * settings.trainer_max_samples_per_key * _bytes_per_sample(features)
    return held + RETRAIN_PEAK_BYTES + PROCESS_BYTES


def _deployed_envs() -> dict[str, tuple[dict[str, str], dict[str, str], float]]:
    """Per deployment: the trainer's environment, the worker's, and the trainer's memory limit."""
    out = {}
    envs = {}
    for name in ("rttsched-trainer", "rttsched-worker"):
        dep = _find("Deployment", name) or _find("StatefulSet", name)
        assert dep is not None, name
        (c,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] in name]
        envs[name] = ({k: v for k, v in _env_of(dep, c).items() if v is not None}, c)
    limit = _quantity(envs["rttsched-trainer"][1]["resources"]["limits"]["memory"])
    out["k8s"] = (envs["rttsched-trainer"][0], envs["rttsched-worker"][0], limit)
    out["docker-compose.yml"] = (_env("trainer"), _env("worker"), _compose_bytes(SERVICES["trainer"]["mem_limit"]))
    return out


@pytest.mark.parametrize("where", ["k8s", "docker-compose.yml"])
def test_the_trainer_holds_a_model_key_for_every_app_the_workers_track_on_each_node_class(where):
    """A key gets a model only by training on its own samples, and past RTT_TRAINER_MAX_KEYS a new key's samples
    are refused: with fewer keys than the workers' apps x node classes, the apps beyond would never get a model."""
    trainer_env, worker_env, _limit = _deployed_envs()[where]
    keys, apps = _settings(trainer_env).trainer_max_keys, _settings(worker_env).worker_max_apps
    assert keys >= len(NODE_CLASSES) * apps, (f"{where}: RTT_TRAINER_MAX_KEYS={keys} holds fewer keys than"
                                             f" {len(NODE_CLASSES)} x RTT_WORKER_MAX_APPS={apps}")


def test_the_trainer_s_memory_limit_holds_its_sample_history_at_its_caps_and_a_retrain():
    envs = _deployed_envs()
    for where, (trainer_env, worker_env, limit) in envs.items():
        needs = _trainer_needs(trainer_env, worker_env)
        assert needs <= (1 - HEADROOM) * limit, f"{where}: {needs / 2**30:.2f} GiB of a {limit / 2**30:.2f} GiB limit"
    # the two deployments hold the same history
    keys = ("RTT_TRAINER_MAX_KEYS", "RTT_TRAINER_MAX_SAMPLES_PER_KEY")
    assert [envs["k8s"][0].get(k) for k in keys] == [envs["docker-compose.yml"][0].get(k) for k in keys]


def test_the_history_states_a_row_s_overhead_as_measured():
    """``SampleHistory.nbytes`` counts only the rows' feature arrays; its docstring says what each row adds beyond,
    which the sizing rule above (ROW_OVERHEAD_BYTES) must cover: measured here with task ids as pods' uids."""
    import tracemalloc
    import uuid

    from app.trainer.history import SampleHistory

    rng = np.random.default_rng(0)
    names = [f"m{j}__mean" for j in range(METRIC_FEATURES - 8)]
    pool = rng.uniform(0, 100, (64, len(names))).round(3)
    samples = [{"model_key": "gCTF:gpu", "task_id": str(uuid.UUID(int=i)), "node": f"node-{i % 50}",
                "node_class": "gpu", "gpu_model": "Tesla M40", "started_ts": 1.0 + i, "rtt_ms": 100.0,
                "input_size_mb": 64.0, "features": dict(zip(names, pool[i % 64].tolist()))}
               for i in range(10_000)]  # the deployed RTT_TRAINER_MAX_SAMPLES_PER_KEY
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        history = SampleHistory(max_per_key=len(samples))
        for s in samples:
            history.add(s, now=s["started_ts"])
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    measured = (held - history.nbytes) / len(history)
    doc = SampleHistory.nbytes.__doc__ or ""
    m = re.search(r"about (\d+) bytes a row", " ".join(doc.split()))
    assert m, doc
    stated = int(m.group(1))
    assert 0.75 * measured <= stated <= 1.25 * measured, f"the docstring says {stated} B a row, measured {measured:.0f}"
    assert measured <= ROW_OVERHEAD_BYTES, measured


def test_the_docs_state_the_deployed_bound_on_model_keys():
    """Someone reading why a sample was refused finds the bound the deployment runs with, not the code's default."""
    deployed = {_settings(env).trainer_max_keys for env, _worker, _limit in _deployed_envs().values()}
    (keys,) = deployed
    stated = []
    for name in ("runbook.md", "deploy.md"):
        text = " ".join((REPO / "docs" / name).read_text(encoding="utf-8").split())
        found = re.findall(r'RTT_TRAINER_MAX_KEYS`?(?::\s*"|\s+keys\s+\(|\s+\()(\d[\d,]*)', text)
        stated += [(name, int(n.replace(",", ""))) for n in found]
    assert stated and all(n == keys for _name, n in stated), (keys, stated)
