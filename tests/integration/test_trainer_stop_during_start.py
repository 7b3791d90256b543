"""``rttsched trainer`` stopped while its clients start, on the real embedded broker.

The broker answers the trainer's start wait (:func:`app.kafka.admin.wait_reachable`) and then takes connections and
answers nothing (its process stopped with SIGSTOP: the kernel still accepts connections on its port): the trainer's
producer waits for its first answer for the client's request timeout (40 s), each client after it as long. SIGTERM
then was honoured only once the start ended, about 40 s later, with ``cannot reach Kafka …`` and exit code 2. Now it
stops the start at once, stops the clients made so far within the stop's bound and exits with code 0, as SIGTERM
during the wait does.

The child stops between the two: the wait answered, it says so in a file and holds until the test has stopped the
broker's process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_children import REPO, START_S, child_env, topics_on

from app.kafka.embedded import EmbeddedBroker

pytestmark = pytest.mark.integration

STOP_S = 20.0  # the trainer's stop bound (TrainerService.stop_timeout_s)

# ``rttsched trainer`` whose start wait, once it has passed, writes ``answered`` and holds until ``gone`` exists;
# ``starting`` is written as the service's start begins
CHILD = """
import asyncio, os, sys
from pathlib import Path

import app.kafka.admin as admin
from app.trainer.service import TrainerService

marks = Path(os.environ["MARKS"])
real = admin.wait_reachable

async def wait_reachable(*args, **kwargs):
    waited = await real(*args, **kwargs)
    (marks / "answered").write_text("")
    while not (marks / "gone").exists():
        await asyncio.sleep(0.05)
    return waited

admin.wait_reachable = wait_reachable
start = TrainerService.start

async def starting(self):
    (marks / "starting").write_text("")
    await start(self)

TrainerService.start = starting
from app.cli.main import main
sys.exit(main(["trainer"]))
"""


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:  # stopped whatever the test did: running again first, were it stopped with SIGSTOP
        try:
            yield b
        finally:
            if b.pid is not None:
                os.kill(b.pid, signal.SIGCONT)


def wait_for(what: Path, proc: subprocess.Popen[str], lines: list[str]) -> None:
    deadline = time.monotonic() + START_S
    while not what.exists():
        assert proc.poll() is None, f"ended (exit {proc.returncode}) before {what.name}:\n{''.join(lines)}"
        assert time.monotonic() < deadline, f"no {what.name} within {START_S:g} s:\n{''.join(lines)}"
        time.sleep(0.05)


def test_sigterm_while_the_clients_start_on_a_broker_that_answers_nothing_stops_the_trainer_promptly(
        broker: EmbeddedBroker, tmp_path: Path) -> None:
    env = child_env(topics_on(broker), tmp_path, RTT_TRAINER_CPUS="", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-c", CHILD], env=env, cwd=REPO, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        lines.extend(proc.stdout)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(tmp_path / "answered", proc, lines)
        assert broker.pid is not None
        os.kill(broker.pid, signal.SIGSTOP)  # takes connections (the kernel's backlog), answers nothing
        (tmp_path / "gone").write_text("")
        wait_for(tmp_path / "starting", proc, lines)
        time.sleep(2.0)  # the producer's first request sent, waiting for its answer
        assert proc.poll() is None, "".join(lines)
        asked = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            code: int | None = proc.wait(STOP_S + 15.0)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - asked
        reader.join(5)
        text = "".join(lines)
        print(text)
        print(f"exit code {code} {took:.1f} s after SIGTERM")
        assert code == 0 and took < STOP_S, f"exit code {code} {took:.1f} s after SIGTERM:\n{text}"
        assert "trainer: stopped (SIGTERM) as it started\n" in lines, text
        assert "Traceback" not in text and "error:" not in text and " ERROR " not in text, text
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
