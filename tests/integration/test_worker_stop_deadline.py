"""``rttsched worker`` told to stop with its broker gone exits within its stop deadline, saying why in one line.

Before, it logged Faust's stop and then waited for the broker — a minute for its consumer thread alone, more
for the producer's flush and the offset commits — until Kubernetes killed it at the end of the grace period,
with no word of why, and printed the consumer thread's traceback on the way. With the broker up, SIGTERM still
stops it cleanly, exit code 0, long before the deadline.

The broker is stopped once the worker runs: Faust's clients and its intakes' own have started (each intake logs it).
A broker gone as the intakes' clients start is another moment (``test_worker_broker_gone_as_intakes_start.py``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from worker_group import wait_settled

from app.cli.processes import ProcessGroup
from app.config import Settings
from app.contracts import contract
from app.kafka.admin import ensure_topics
from app.kafka.embedded import EmbeddedBroker, free_port
from app.streams.shutdown import DEFAULT_STOP_TIMEOUT_S

pytestmark = pytest.mark.integration

DEADLINE_S = 3.0
# After the deadline: the broker probe (at most 2 s) and the process's exit, with room for a shared machine. A worker
# that does not stop by its deadline takes far longer: the 30 s default deadline if the flag were not applied,
# a minute and more (Faust's consumer thread alone) with no deadline at all.
MARGIN_S = 9.0
CLEAN_STOP_S = 15.0  # a stop with the broker up: well within the default deadline (30 s)
ERROR_LOGGER = " ERROR app.streams.shutdown: "
INTAKES = ("node-features", "feedback-join")  # the worker's intakes (app.streams.intake)


def start_settled_worker(group: ProcessGroup, s: Settings, *flags: str) -> subprocess.Popen[bytes]:
    """Start ``rttsched worker`` and wait until it has joined its group, recovered its partitions and started the
    clients of its intakes (its own consumer and producer each, started by Faust's tasks once Faust runs: a broker
    stopped before that stops it as it starts, not as it runs)."""
    port = free_port()
    proc = group.start("worker", ["worker", "--session-timeout-s", "6", "--datadir", str(group.log_dir / "faust"),
                                  *flags], env={
        "RTT_KAFKA_BOOTSTRAP": s.bootstrap_servers, "RTT_TOPIC_PREFIX": s.topic_prefix,
        "RTT_METRICS_PORT": str(port), "RTT_MODELS_DIR": s.models_dir, "REDIS_URL": "",
    })
    group.wait_http("worker", f"http://127.0.0.1:{port}/readyz", timeout_s=30)  # Faust runs: not waiting for Kafka
    wait_settled(group, ["worker"], contract("node-metrics").partitions)
    log, deadline = group.log_dir / "worker.log", time.monotonic() + 30
    started = [f" INFO app.streams.intake: {name}: its consumer and producer started" for name in INTAKES]
    while not all(line in log.read_text(errors="replace") for line in started):
        assert proc.poll() is None and time.monotonic() < deadline, group.log_tail("worker", 60)
        time.sleep(0.05)
    return proc


def sigterm_and_wait(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[int | None, float]:
    """SIGTERM the worker's process group; its exit code (None: still running after ``timeout_s``) and the time."""
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        code: int | None = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    return code, time.monotonic() - t0


def test_with_the_broker_gone_sigterm_exits_by_the_deadline_with_one_error_line(
        tmp_path: Path, settings_factory: Callable[..., Settings]) -> None:
    with EmbeddedBroker() as broker, ProcessGroup(tmp_path) as group:
        s = settings_factory(kafka_bootstrap=broker.bootstrap)
        asyncio.run(ensure_topics(s))
        proc = start_settled_worker(group, s, "--stop-timeout-s", f"{DEADLINE_S:g}")
        broker.kill()
        # waited for past the default deadline: a worker that stops by that one instead of its own is measured
        code, took = sigterm_and_wait(proc, DEFAULT_STOP_TIMEOUT_S + MARGIN_S)
        out = (tmp_path / "worker.log").read_text(errors="replace")
        assert code == 1, f"exit code {code} after {took:.1f}s:\n{group.log_tail('worker', 30)}"
    assert DEADLINE_S <= took < DEADLINE_S + MARGIN_S, f"exited after {took:.1f}s"
    errors = [line.split(ERROR_LOGGER, 1)[1] for line in out.splitlines() if ERROR_LOGGER in line]
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"worker did not finish stopping within {DEADLINE_S:g} s of SIGTERM (")
    assert f"the broker at {s.bootstrap_servers} does not answer" in errors[0]
    assert "exiting with code 1 without finishing its shutdown" in errors[0]
    assert "Traceback" not in out


def test_with_the_broker_up_sigterm_stops_cleanly_and_quickly(kafka_settings: Settings, tmp_path: Path) -> None:
    with ProcessGroup(tmp_path) as group:
        proc = start_settled_worker(group, kafka_settings)
        # waited for past the default deadline, so that a slow stop is measured, not cut short by the wait
        code, took = sigterm_and_wait(proc, DEFAULT_STOP_TIMEOUT_S + MARGIN_S)
        out = (tmp_path / "worker.log").read_text(errors="replace")
    assert code == 0, f"exit code {code} after {took:.1f}s:\n{out[-3000:]}"
    assert took < CLEAN_STOP_S, f"a clean stop took {took:.1f}s"
    assert ERROR_LOGGER not in out and "did not finish stopping" not in out
    assert "Traceback" not in out
    assert "\x1b[" not in out and "\a" not in out  # no terminal codes in a log file (Faust's spinner)
