"""What the README and docs/deploy.md tell an operator to set and run holds for the files and settings it names."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from app.config import Settings

REPO = Path(__file__).resolve().parents[3]
DEPLOY_MD = REPO / "docs" / "deploy.md"
README = REPO / "README.md"
# what a step before the deployment may run here: the commands that make a secret file
SECRET_MAKERS = {"mkdir", "openssl", "chmod"}


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def _steps(text: str) -> list[str]:
    """The commands of a text in their order: each line of a fenced block, each `inline` span."""
    steps: list[str] = []
    for m in re.finditer(r"```\w*\n(.*?)```|`([^`\n]+)`", text, re.S):
        lines = m.group(1).splitlines() if m.group(1) is not None else [m.group(2)]
        steps += [line.split(" #")[0].strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    return steps


def _compose_secret_files() -> list[str]:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text(encoding="utf-8"))
    return [str(Path(s["file"])) for s in compose["secrets"].values()]


def _kustomize_secret_files() -> list[str]:
    kust = yaml.safe_load((REPO / "k8s" / "kustomization.yaml").read_text(encoding="utf-8"))
    return [f"k8s/{f.split('=', 1)[-1]}" for g in kust["secretGenerator"] for f in g.get("files", [])]


@pytest.mark.parametrize(("deploy", "files"), [("docker compose up", _compose_secret_files()),
                                               ("kubectl apply -k", _kustomize_secret_files())])
def test_the_readme_creates_the_secret_files_before_it_deploys(tmp_path, deploy, files):
    """The files are never committed (.gitignore): the README's steps, run in order in an empty checkout up to
    the deployment, must leave each one there, or compose cannot mount the secret and kustomize fails."""
    assert files
    steps = _steps(_section(README.read_text(encoding="utf-8"), "## Deploying"))
    for step in steps:
        if step.startswith(deploy):
            break
        words = {shlex.split(part)[0] for part in re.split(r"&&|;", step) if part.strip()}
        if words <= SECRET_MAKERS:
            subprocess.run(["bash", "-c", step], cwd=tmp_path, check=True, timeout=30)
    else:
        pytest.fail(f"the README's Deploying section never runs {deploy!r}")
    for f in files:
        assert (tmp_path / f).is_file() and (tmp_path / f).stat().st_size > 0, f"{f} is not made before {deploy!r}"


def test_deploy_md_says_how_to_listen_on_an_ipv6_cluster(known_env):
    text = DEPLOY_MD.read_text(encoding="utf-8")
    names = ("RTT_EXTENDER_HOST", "RTT_METRICS_HOST")
    for name in names:
        assert f'`{name}: "::"`' in text, f"docs/deploy.md does not say to set {name} to :: on an IPv6 cluster"
        assert name in known_env
    settings = Settings.from_env(dict.fromkeys(names, "::"))
    assert (settings.extender_host, settings.metrics_host) == ("::", "::")


def _deployments() -> dict[str, dict]:
    docs = [d for p in sorted((REPO / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    return {d["metadata"]["name"]: d for d in docs if d.get("kind") in ("Deployment", "ConfigMap")}


def test_logs_are_read_from_the_pod_that_does_the_work():
    """``kubectl logs deploy/NAME`` reads one pod kubectl picks: the docs read a Deployment's logs so only where it
    has one replica; the second scheduler's two replicas are read through the leader its Lease names."""
    objects = _deployments()
    for path in sorted((REPO / "docs").glob("*.md")):
        for name in re.findall(r"logs (?:deploy|deployment)/([\w-]+)", path.read_text(encoding="utf-8")):
            assert objects[name]["spec"].get("replicas", 1) == 1, f"{path.name}: logs {name} may read the standby"
    config = yaml.safe_load(objects["rtt-scheduler-config"]["data"]["scheduler-config.yaml"])["leaderElection"]
    assert config["leaderElect"] is True
    lease = (f"kubectl -n {config['resourceNamespace']} get lease {config['resourceName']} "
             "-o jsonpath='{.spec.holderIdentity}'")
    assert lease in DEPLOY_MD.read_text(encoding="utf-8"), "docs/deploy.md does not find the scheduler's leader"


def _paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def test_the_image_is_set_with_kubectl_alone_or_says_it_needs_the_standalone_kustomize():
    """kubectl has kustomize built in but no ``kustomize edit``: the docs set the image with an overlay's ``images:``
    entry, and wherever ``kustomize edit`` is named, the same paragraph says it is the standalone binary's."""
    texts = {p.name: p.read_text(encoding="utf-8") for p in [*sorted((REPO / "docs").glob("*.md")), README]}
    texts["k8s/kustomization.yaml"] = (REPO / "k8s" / "kustomization.yaml").read_text(encoding="utf-8")
    for name, text in texts.items():
        for para in _paragraphs(text):
            if "kustomize edit" in para:
                assert "standalone" in para, f"{name}: `kustomize edit` without saying kubectl has none: {para[:120]}"
    kust = yaml.safe_load((REPO / "k8s" / "kustomization.yaml").read_text(encoding="utf-8"))
    (image,) = [i["name"] for i in kust["images"]]
    overlays = [d for block in re.findall(r"```yaml\n(.*?)```", DEPLOY_MD.read_text(encoding="utf-8"), re.S)
                if isinstance(d := yaml.safe_load(block), dict) and d.get("kind") == "Kustomization"]
    assert any("../k8s" in o["resources"] and any(i["name"] == image and i.get("newName") for i in o.get("images", []))
               for o in overlays), "docs/deploy.md shows no overlay that sets the image"


def test_the_runbook_s_up_queries_read_both_scrape_setups():
    """With annotation scraping (a ``kubernetes-pods`` job) a component's ``up`` carries no job of its own but its
    pod label app_kubernetes_io_name: each query on ``up{job="rttsched-..."}`` reads that form too, as the alerts do."""
    text = (REPO / "docs" / "runbook.md").read_text(encoding="utf-8")
    for block in re.findall(r"```promql\n(.*?)```", text, re.S):
        for line in block.splitlines():
            for component in re.findall(r'up\{job="(rttsched-[\w-]+)"\}', line):
                assert f'up{{app_kubernetes_io_name="{component}"}}' in line, line


def _subsection(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    end = re.search(r"\n#{1,3} ", text[start + 1:])
    return text[start:start + 1 + end.start() if end else None]


def test_the_https_steps_make_the_namespace_then_the_secret_then_apply_the_overlay():
    """On a fresh cluster ``kubectl -n rttsched create secret`` fails before the namespace exists, and an overlay
    applied before the Secret leaves the extender and the scheduler in ContainerCreating until it does."""
    text = _subsection(DEPLOY_MD.read_text(encoding="utf-8"), "### The extender over HTTPS")
    steps = [s for s in _steps(text) if s.startswith("kubectl ")]
    (secret,) = [i for i, s in enumerate(steps) if "create secret generic rttsched-extender-tls" in s]
    (namespace,) = [i for i, s in enumerate(steps)
                    if s in ("kubectl create namespace rttsched", "kubectl apply -f k8s/namespace.yaml")]
    overlay = [i for i, s in enumerate(steps) if s.startswith("kubectl apply -k ")]
    assert namespace < secret and overlay and overlay[0] > secret, steps
    if steps[namespace].endswith("k8s/namespace.yaml"):
        (ns,) = yaml.safe_load_all((REPO / "k8s" / "namespace.yaml").read_text(encoding="utf-8"))
        assert (ns["kind"], ns["metadata"]["name"]) == ("Namespace", "rttsched")
    # turning HTTPS on in a running install: the rollout's window in which the scheduler's calls fail
    prose = " ".join(text.split())
    assert "ignorable: true" in prose and "until the rollout ends" in prose
