"""``rttsched broker`` and its Tansu child live and die together.

A Tansu that died left ``rttsched broker`` running with no broker behind it (docker and Kubernetes saw a healthy
process); a SIGHUP (the terminal or SSH session closed) or a SIGKILL of ``rttsched broker`` left Tansu, in a session
of its own, holding the port, so the next ``rttsched broker --port SAME`` failed with "already in use".
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from child_processes import alive, gone_within

from app.kafka.embedded import EmbeddedBroker

pytestmark = pytest.mark.integration

LINUX = sys.platform.startswith("linux")


@dataclass
class Running:
    proc: subprocess.Popen[str]
    tansu: int
    port: int
    out: list[str]


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def broker_cli() -> Iterator[Running]:
    """``rttsched broker --port 0 --no-topics`` as a process of its own, once it printed where it listens; it and
    its Tansu are stopped whatever the test did."""
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", "broker", "--port", "0", "--no-topics"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
                            start_new_session=True)
    tansu: int | None = None
    try:
        assert proc.stdout is not None
        out = [proc.stdout.readline()]  # its first line: where it listens
        m = re.fullmatch(r"embedded broker listening on 127\.0\.0\.1:(\d+) \(pid (\d+)\)\n", out[0])
        assert m, out[0] + (proc.stderr.read() if proc.stderr and proc.poll() is not None else "")
        tansu = int(m.group(2))
        yield Running(proc, tansu, int(m.group(1)), out)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        if tansu is not None:  # its own session: the broker's process group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(tansu, signal.SIGKILL)


def test_a_tansu_that_dies_ends_the_command_with_one_line_and_code_2():
    with broker_cli() as b:
        os.kill(b.tansu, signal.SIGKILL)
        t0 = time.monotonic()
        out, err = b.proc.communicate(timeout=10)
        waited = time.monotonic() - t0
        assert b.proc.returncode == 2, err
    assert waited < 3, waited  # it looks five times a second
    assert "Traceback" not in err, err
    last = err.rstrip("\n").splitlines()[-1]  # after its INFO lines; Tansu's last line, if it said one, follows
    assert last.startswith(
        f"rttsched broker: error: the embedded broker (pid {b.tansu}) was killed by signal 9 (SIGKILL)"), err
    assert "embedded broker stopped" not in out


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT])
def test_a_hangup_stops_tansu_as_sigterm_does_and_frees_the_port(sig):
    """The terminal or SSH session closed: SIGHUP goes to ``rttsched broker`` only (Tansu has a session of its own),
    which used to die of it, leaving Tansu on the port."""
    with broker_cli() as b:
        assert _port_taken(b.port)
        os.kill(b.proc.pid, sig)
        out, err = b.proc.communicate(timeout=15)
        assert b.proc.returncode == 0, err
        assert not alive(b.tansu)
        assert not _port_taken(b.port)
        assert out.rstrip("\n").splitlines()[-1] == "embedded broker stopped", out
        assert "error" not in err.lower(), err


@pytest.mark.skipif(not LINUX, reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_command_takes_tansu_with_it():
    with broker_cli() as b:
        os.kill(b.proc.pid, signal.SIGKILL)
        b.proc.wait(10)
        assert gone_within(b.tansu, 5), f"Tansu (pid {b.tansu}) outlived the SIGKILLed rttsched broker"
        deadline = time.monotonic() + 5
        while _port_taken(b.port) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _port_taken(b.port)


def test_a_broker_started_from_a_thread_that_ends_keeps_running():
    """Linux sends the parent-death signal when the *thread* that started the child ends: the tests and the fault
    stack start brokers through ``asyncio.to_thread``, whose threads end before the broker should."""
    broker = EmbeddedBroker()
    started = threading.Thread(target=broker.start, name="starts-the-broker")
    started.start()
    started.join(30)
    pid = broker.pid
    try:
        assert pid is not None and broker.ended() is None
        time.sleep(0.5)  # a parent-death signal would have arrived by now
        assert broker.ended() is None and alive(pid) and _port_taken(broker.port)
    finally:
        broker.stop()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    assert broker.ended() is None  # stopped: no process to ask


@pytest.mark.parametrize(("sig", "how"), [(signal.SIGKILL, "was killed by signal 9 (SIGKILL)"),
                                         (signal.SIGTERM, "exited with status 0")])  # stopped on purpose
def test_ended_says_how_the_broker_ended(sig, how):
    broker = EmbeddedBroker().start()
    pid = broker.pid
    try:
        assert pid is not None and broker.ended() is None
        os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while broker.ended() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        # what it printed last ("ready in 4ms") is no cause: only an error line of Tansu's would be added
        assert str(broker.ended()) == f"the embedded broker (pid {pid}) {how}"
    finally:
        broker.stop()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
