"""The long-running services started before their broker wait for it, on the real embedded broker: ``rttsched
trainer`` and ``rttsched worker`` started with nothing on their bootstrap port keep running, log one ``waiting for
Kafka`` WARNING and answer probes (``/readyz`` 503 naming ``kafka``; the trainer's ``/healthz`` 200); a broker started
on that port, and its topics created, brings them up on their own (``answered after``, ``/readyz`` 200, the worker's
Faust web server on the same port). SIGTERM during the wait stops each service (worker, trainer, bridge) at once with
one line and exit code 0. Before, each of them exited at once with code 2 (``cannot reach Kafka at …``) and relied on
its supervisor to start it again, which Kubernetes does after a back-off growing to 5 minutes."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from child_processes import Gathered, http_get

from app.config import Settings
from app.kafka.admin import ensure_topics
from app.kafka.embedded import EmbeddedBroker, free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
START_S = 90.0  # a service's imports and first try, on a loaded machine


class Service(Gathered):
    """``rttsched <argv>`` in a session of its own, its output (stdout and stderr) gathered by a thread."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        super().__init__(subprocess.Popen([sys.executable, "-m", "app.cli.main", *argv], env=env, cwd=cwd,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                          start_new_session=True))

    def wait_for(self, what: Callable[[], bool], timeout_s: float, label: str) -> float:
        """The monotonic time ``what`` first held; fails naming ``label`` (and the output) if it did not."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if what():
                return time.monotonic()
            if self.proc.poll() is not None and not what():
                self.read_to_end()
                pytest.fail(f"ended (exit {self.proc.returncode}) before {label}:\n{self.text[-4000:]}")
            time.sleep(0.05)
        pytest.fail(f"no {label} within {timeout_s:g} s:\n{self.text[-4000:]}")

    def line(self, pattern: str, timeout_s: float = START_S) -> float:
        return self.wait_for(lambda: re.search(pattern, self.text) is not None, timeout_s, repr(pattern))

    def sigterm(self, timeout_s: float) -> tuple[int, float]:
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout_s)
        took = time.monotonic() - started
        self.read_to_end()
        return code, took


@pytest.fixture
def service_factory(tmp_path: Path) -> Iterator[Callable[..., Service]]:
    started: list[Service] = []

    def start(argv: list[str], **env: str) -> Service:
        base = {k: v for k, v in os.environ.items() if not k.startswith("RTT_") and k != "REDIS_URL"}
        base.update(RTT_MODELS_DIR=str(tmp_path / "models"), RTT_WORKER_DATADIR=str(tmp_path / "faust"),
                    RTT_METRICS_HOST="127.0.0.1", RTT_REGISTRY_CHECK_S="0")
        service = Service(argv, {**base, **env}, REPO)
        started.append(service)
        return service

    yield start
    for service in started:
        service.kill()


@pytest.mark.parametrize("command", ["trainer", "worker"])
def test_a_service_started_before_its_broker_waits_and_comes_up_once_the_broker_and_its_topics_are_there(
        service_factory: Callable[..., Service], command: str) -> None:
    port, metrics = free_port(), free_port()
    prefix = f"t{uuid.uuid4().hex[:10]}-"
    service = service_factory([command], RTT_KAFKA_BOOTSTRAP=f"127.0.0.1:{port}", RTT_TOPIC_PREFIX=prefix,
                              RTT_METRICS_PORT=str(metrics))
    service.line(rf"WARNING app\.kafka\.admin: {command}: waiting for Kafka: cannot reach Kafka at 127\.0\.0\.1:{port} "
                 r"\(RTT_KAFKA_BOOTSTRAP\): .*; trying again every 1-10 s until it answers")
    time.sleep(3.0)  # more tries: still running, still one WARNING
    assert service.proc.poll() is None, service.text
    assert service.text.count("waiting for Kafka") == 1, service.text
    status, body = http_get(metrics, "/readyz")
    assert status == 503 and body.startswith(b"not ready: kafka: cannot reach Kafka at"), (status, body)
    assert http_get(metrics, "/healthz" if command == "trainer" else "/metrics")[0] == 200  # what liveness asks

    broker = EmbeddedBroker(port=port).start()
    try:
        asyncio.run(ensure_topics(Settings.from_env({}, kafka_bootstrap=broker.bootstrap, topic_prefix=prefix)))
        topics_at = time.monotonic()
        answered_at = service.line(rf"INFO app\.kafka\.admin: {command}: Kafka at 127\.0\.0\.1:{port} answered after "
                                   r"[\d.]+ s of waiting", timeout_s=60)
        if command == "trainer":
            service.line(r"trainer started: samples from", timeout_s=60)
            ready_at = service.wait_for(lambda: http_get(metrics, "/readyz")[0] == 200, 30, "/readyz 200")
        else:  # Faust's web server, on the port the wait answered on
            service.line(rf"worker {prefix}rttsched-worker on 127\.0\.0\.1:{port}", timeout_s=30)
            ready_at = service.wait_for(lambda: http_get(metrics, "/readyz") == (200, b'{"ready":true,"degraded":{}}'),
                                        90, "Faust's /readyz")
        print(f"{command}: answered {answered_at - topics_at:.1f} s, ready {ready_at - topics_at:.1f} s after "
              "its topics were created")
        # the tries are at most 10 s (+20 % jitter) apart, and a try (an admin client, a listing) may take a few
        # seconds more on a loaded machine: within 20 s, not the minutes of a supervisor's back-off
        assert answered_at - topics_at < 20.0
        code, took = service.sigterm(60)
        assert code == 0, service.text[-4000:]
    finally:
        broker.stop()
    assert "Traceback" not in service.text, service.text[-4000:]
    assert "cannot reach Kafka at" in service.text and "error:" not in service.text


BRIDGE = ["bridge", "--target", "node=w1,url=http://127.0.0.1:9/m"]


@pytest.mark.parametrize(("argv", "signum", "code", "said"), [
    (["worker"], signal.SIGTERM, 0, "worker: stopped (SIGTERM) while waiting for Kafka"),
    (["trainer"], signal.SIGTERM, 0, "trainer: stopped (SIGTERM) while waiting for Kafka"),
    (BRIDGE, signal.SIGTERM, 0, "bridge: stopped (SIGTERM), 0 rounds, 0 messages"),
    (["worker"], signal.SIGINT, 0, "worker: stopped (SIGINT) while waiting for Kafka"),  # Ctrl-C: as SIGTERM
    (BRIDGE, signal.SIGINT, 130, "rttsched bridge: interrupted"),  # the bridge's Ctrl-C is an interruption
], ids=["worker-SIGTERM", "trainer-SIGTERM", "bridge-SIGTERM", "worker-SIGINT", "bridge-SIGINT"])
def test_a_signal_while_a_service_waits_for_its_broker_stops_it_at_once(
        service_factory: Callable[..., Service], argv: list[str], signum: int, code: int, said: str) -> None:
    port, metrics = free_port(), free_port()
    service = service_factory(argv, RTT_KAFKA_BOOTSTRAP=f"127.0.0.1:{port}", RTT_METRICS_PORT=str(metrics))
    service.line(rf"{argv[0]}: waiting for Kafka: cannot reach Kafka at 127\.0\.0\.1:{port}")
    time.sleep(1.5)  # in a pause between two tries, or in a try
    started = time.monotonic()
    service.proc.send_signal(signum)
    assert service.proc.wait(30) == code, service.text[-4000:]
    assert time.monotonic() - started < 5.0
    service.kill()  # its output read to the end
    assert service.text.strip().splitlines()[-1].startswith(said), service.text[-4000:]
    assert "Traceback" not in service.text and "error:" not in service.text, service.text[-4000:]
