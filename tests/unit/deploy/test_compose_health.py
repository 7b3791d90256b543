"""Each component's healthcheck in docker-compose.yml asks a page its process serves, on the port it serves it, and
one that fails while the process is stuck -- what the liveness probes in k8s/ ask.

The bridge and the trainer serve ``/metrics`` and ``/healthz`` from a thread (:mod:`app.health`): ``/metrics``
answers whatever their event loop does, ``/healthz`` fails (503) once it has not run for 30 s, so their healthcheck
is run here, as compose runs it, against that server with a beating and with a silent heartbeat. The worker serves
``/metrics`` and ``/readyz`` from its event loop (Faust's web server) and no ``/healthz``; the extender ``/healthz``
and ``/readyz`` from its own (measured by running them: docs/deploy.md, Ports).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from app.config import Settings
from app.health import Heartbeat, serve_metrics_and_health
from app.kafka.embedded import free_port

REPO = Path(__file__).resolve().parents[3]
SERVICES = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
THREAD_SERVED = ("bridge", "trainer")  # app/cli/bridge.py (serve_metrics), app/cli/trainer.py (serve_health)
# http://127.0.0.1: then the port, literal or read from the environment, then the path
_URL = re.compile(r"'http://127\.0\.0\.1:(?:' \+ os\.environ\['(?P<var>\w+)'\] \+ '|(?P<port>\d+))(?P<path>/[\w/]*)'")


def healthcheck(name: str) -> tuple[list[str], str, str]:
    """The service's healthcheck command (``python3``: this interpreter), the port (a variable of the service's
    environment, or a number) and the path it asks."""
    test = SERVICES[name]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python3", "-c"], f"{name}: {test}"
    m = _URL.search(test[3])
    assert m is not None, f"{name}: no URL on this host in {test[3]!r}"
    return [sys.executable, "-c", test[3]], m["var"] or m["port"], m["path"]


def _port(name: str, where: str) -> int:
    env = {k: str(v) for k, v in SERVICES[name].get("environment", {}).items()}
    return int(env[where] if where.startswith("RTT_") else where)


@pytest.mark.parametrize("name", THREAD_SERVED)
def test_thread_served_components_are_checked_on_healthz_which_fails_while_their_loop_is_stuck(name):
    command, where, path = healthcheck(name)
    clock = [0.0]
    assert where == "RTT_METRICS_PORT" and _port(name, where) > 0, f"{name}: asks port {where}"
    heartbeat = Heartbeat(stale_after_s=30.0, clock=lambda: clock[0])
    port = free_port()
    server = serve_metrics_and_health(port, "127.0.0.1", CollectorRegistry(), heartbeat)
    env = {**os.environ, "RTT_METRICS_PORT": str(port)}
    try:
        alive = subprocess.run(command, env=env, capture_output=True, text=True, timeout=20, check=False)
        assert alive.returncode == 0, f"{name}: {path} on a live process: {alive.stderr}"
        clock[0] = 45.0  # the event loop silent for 45 s
        stuck = subprocess.run(command, env=env, capture_output=True, text=True, timeout=20, check=False)
        assert stuck.returncode != 0, f"{name}: the healthcheck ({path}) passes while the event loop is stuck"
        assert "503" in stuck.stderr, stuck.stderr
    finally:
        server.shutdown()
        server.server_close()


def test_the_worker_is_checked_on_a_page_its_web_server_serves(tmp_path):
    from app.streams.app import create_app

    _, where, path = healthcheck("worker")
    assert where == "RTT_METRICS_PORT" and _port("worker", where) > 0
    app = create_app(Settings.from_env({}, models_dir=str(tmp_path / "models"), worker_datadir=str(tmp_path / "w")))
    assert path in app.web.views, f"worker: {path} is not served (it serves {sorted(app.web.views)})"


def test_the_extender_is_checked_on_a_page_it_serves_on_its_port():
    from app.extender.server import ExtenderServer
    from app.extender.service import ExtenderService
    from app.scheduler.policy import Policy

    _, where, path = healthcheck("extender")
    env = {k: str(v) for k, v in SERVICES["extender"]["environment"].items()}
    assert _port("extender", where) == int(env["RTT_EXTENDER_PORT"])
    server = ExtenderServer(ExtenderService(Settings.from_env({}), policy=Policy(), kafka=False, redis=False))
    assert server.handler("GET", path) is not None


def test_every_component_has_a_healthcheck_on_its_own_page():
    for name in ("bridge", "worker", "trainer", "extender"):
        _, _, path = healthcheck(name)
        assert path in {"/healthz", "/readyz"}, f"{name}: a healthcheck on {path}"
