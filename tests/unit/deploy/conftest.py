"""What the deployment tests check files against: the CLI, the settings, the metrics defined in app/.

Everything here is read from the code itself, so a renamed command, setting or metric makes the
deployment files fail their tests instead of failing in a cluster.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from metric_names import metric_series, promql_metrics

REPO = Path(__file__).resolve().parents[3]
APP = REPO / "app"

# Images that are not built from deploy/Dockerfile.
THIRD_PARTY_IMAGES = ("registry.k8s.io/kube-scheduler", "redis", "apache/kafka", "prom/", "grafana/")

# Series Prometheus and prometheus_client produce by themselves; a dashboard may query them.
BUILTIN_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_series_added",
                  "kube_node_status_capacity"}  # the last from kube-state-metrics: a node's nvidia.com/gpu capacity
BUILTIN_PREFIXES = ("process_", "python_gc_", "python_info")

_ENV_NAME = re.compile(r"RTT_[A-Z0-9_]+")


def _project_version() -> str:
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


@pytest.fixture(scope="session")
def project_version() -> str:
    return _project_version()


@pytest.fixture(scope="session")
def project_image() -> str:
    """The image every rttsched component runs: ``rttsched/rttsched:<version of pyproject.toml>``."""
    return f"rttsched/rttsched:{_project_version()}"


@pytest.fixture(scope="session")
def is_third_party() -> Callable[[str], bool]:
    """Whether an image is someone else's (not built from deploy/Dockerfile)."""
    return lambda image: image.startswith(THIRD_PARTY_IMAGES)


@pytest.fixture(scope="session")
def entrypoint() -> list[str]:
    """The exec-form ENTRYPOINT of deploy/Dockerfile."""
    for line in (REPO / "deploy" / "Dockerfile").read_text().splitlines():
        if line.startswith("ENTRYPOINT "):
            return list(ast.literal_eval(line.removeprefix("ENTRYPOINT ").strip()))
    raise AssertionError("deploy/Dockerfile has no ENTRYPOINT")


def _env_reads(tree: ast.AST) -> set[str]:
    """Literal names read through ``os.environ[...]``, ``os.environ.get(...)`` or ``os.getenv(...)``."""
    names = set()
    for node in ast.walk(tree):
        key: ast.expr | None = None
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            key = node.slice
        elif isinstance(node, ast.Call) and node.args and ast.unparse(node.func) in ("os.environ.get", "os.getenv"):
            key = node.args[0]
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.add(key.value)
    return names


def _app_trees() -> list[ast.Module]:
    return [ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in sorted(APP.rglob("*.py"))]


def _env_name_literals(tree: ast.AST) -> set[str]:
    """String constants that are exactly an ``RTT_*`` variable name (option tables, error fields)."""
    return {n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and _ENV_NAME.fullmatch(n.value)}


@pytest.fixture(scope="session")
def known_env() -> set[str]:
    """Environment variables rttsched reads: every Settings field, plus those a component reads itself
    (``os.environ`` lookups and option tables naming the variable, e.g. the extender's options)."""
    from app.config import Settings

    names = {name for name, _default, _doc in Settings.describe()}
    for tree in _app_trees():
        names |= _env_reads(tree) | _env_name_literals(tree)
    return names


@pytest.fixture(scope="session")
def app_series() -> set[str]:
    """Every series name the metrics defined in app/ expose."""
    out: set[str] = set()
    for tree in _app_trees():
        out |= metric_series(tree)
    return out


@pytest.fixture(scope="session")
def undefined_metrics(app_series: set[str]) -> Callable[[Sequence[str]], set[str]]:
    """The metric names PromQL expressions query that neither app/ nor Prometheus itself defines."""

    def undefined(exprs: Sequence[str]) -> set[str]:
        used: set[str] = set().union(*(promql_metrics(e) for e in exprs))
        return {m for m in used
                if m not in app_series and m not in BUILTIN_SERIES and not m.startswith(BUILTIN_PREFIXES)}

    return undefined


@pytest.fixture(scope="session")
def check_cli() -> Callable[[Sequence[str]], str | None]:
    """A checker of one container's argv: None if ``rttsched`` accepts it, else what is wrong.

    The subcommand must be one of the CLI's COMMANDS; when its module exists, the whole argv must
    parse with the real argument parser.
    """
    from app.cli.main import COMMANDS, _available, build_parser

    parser = build_parser()
    available = set(_available())

    def check(argv: Sequence[str]) -> str | None:
        if len(argv) < 2 or Path(argv[0]).name != "rttsched":
            return f"{list(argv)} does not run rttsched <command>"
        if argv[1] not in COMMANDS:
            return f"{argv[1]!r} is not an rttsched command ({', '.join(COMMANDS)})"
        if argv[1] in available:
            try:
                parser.parse_args(list(argv[1:]))
            except SystemExit:
                return f"rttsched rejects the arguments {list(argv[1:])}"
        return None

    return check
