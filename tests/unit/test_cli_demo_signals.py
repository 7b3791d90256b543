"""``rttsched demo`` stops every child on a hang-up (SIGHUP: the terminal or SSH session closed) as on SIGTERM, and
exits with 128 + the number of the signal that stopped it: 129 (SIGHUP), 143 (SIGTERM), 130 (SIGINT).

It died of the SIGHUP without its clean-up, leaving worker, trainer and extender (each in a session of its own, so
untouched by the terminal) running under PID 1. These tests run the real command's signal handling and clean-up in
a process of its own (``main(["demo", ...])``) with stand-ins for what takes a minute to start: the broker, the
topics, the readiness checks and the live run (which only checks its children until it is stopped); the children
are ``sleep`` (``sys.executable`` is a script that execs it), started by the demo's own
:class:`~app.cli.processes.ProcessGroup`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from child_processes import alive, default_signals, demo_env, left_running, lines_until, on_terminal, sleeper

ROOT = Path(__file__).resolve().parents[2]
CHILDREN = ("worker", "trainer", "extender")
READY = b"demo: ready after"

DEMO = """
import sys, time
from pathlib import Path
import app.cli.demo as demo
import app.cli.processes as processes
import app.kafka.admin as admin
import app.kafka.embedded as embedded
import app.sim.live as live

fake_python, out = sys.argv[1], Path(sys.argv[2])


class Broker:
    bootstrap, pid = "127.0.0.1:9", None

    def start(self):
        return self

    def stop(self):
        (out / "broker-stopped").write_text("yes")


async def ensure_topics(*_args, **_kwargs):
    return []


def run_live(*_args, on_tick, **_kwargs):
    while True:
        on_tick()
        time.sleep(0.05)


embedded.EmbeddedBroker = Broker
admin.ensure_topics = ensure_topics
live.run_live = run_live
processes.ProcessGroup.wait_http = lambda *_args, **_kwargs: None
sys.executable = fake_python  # the children: sleep
from app.cli.main import main
sys.exit(main(["demo", "--out", str(out), "--minutes", "1", "--no-html"]))
"""


def _children(out: Path) -> dict[str, int]:
    try:
        pids = json.loads((out / "logs" / "pids.json").read_text())
    except (FileNotFoundError, ValueError):  # not written yet, or cut short while written
        return {}
    return {name: pid for name, pid in pids.items() if name in CHILDREN}


def _stop_children(out: Path) -> None:
    """Kill every child of ``<out>/logs/pids.json`` still alive (each leads its own process group)."""
    for pid in _children(out).values():
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def _ignore_hangup() -> None:
    """``nohup``."""
    default_signals()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


@pytest.fixture
def fake_python(tmp_path: Path) -> Path:
    return sleeper(tmp_path)


@contextlib.contextmanager
def _started(fake_python: Path, out: Path, preexec: Callable[[], None]) -> Iterator[subprocess.Popen[bytes]]:
    """The demo started with stand-ins; at the end it is killed if still running, and so is every child left."""
    proc = subprocess.Popen([sys.executable, "-c", DEMO, str(fake_python), str(out)], cwd=ROOT, env=demo_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=preexec)  # noqa: PLW1509 - only sets signal dispositions
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        _stop_children(out)


def _wait_ready(proc: subprocess.Popen[bytes], out: Path) -> dict[str, int]:
    assert proc.stderr is not None
    said = lines_until(proc.stderr, lambda line: line.startswith(READY) or (not line and proc.poll() is not None), 60)
    assert said[-1].startswith(READY), f"not ready (exit code {proc.poll()}): {b''.join(said[-5:])!r}"
    pids = _children(out)
    assert set(pids) == set(CHILDREN) and all(alive(p) for p in pids.values()), pids
    return pids


@pytest.mark.parametrize("sig, code", [(signal.SIGHUP, 129), (signal.SIGTERM, 143), (signal.SIGINT, 130)],
                         ids=["SIGHUP", "SIGTERM", "SIGINT"])
def test_a_hangup_stops_every_child_as_sigterm_does(tmp_path: Path, fake_python: Path, sig: int, code: int) -> None:
    """Every stopping signal runs the whole clean-up, and the demo exits with 128 + the signal's number, as a shell
    reports a command that signal ended (a hang-up's was 130, Ctrl-C's)."""
    out = tmp_path / "demo"
    with _started(fake_python, out, default_signals) as proc:
        pids = _wait_ready(proc, out)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        text = err.decode(errors="replace")
        assert proc.returncode == code, text  # not -sig, dead of the signal before its clean-up
        assert "demo: stopped everything it started" in text
        assert text.rstrip("\n").splitlines()[-1] == "rttsched demo: interrupted", text
        assert "Traceback" not in text, text
        assert left_running(pids, 0.0) == []  # stopped by the clean-up, not later
        assert (out / "broker-stopped").exists()


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_second_signal_during_the_clean_up_does_not_cut_it_short(tmp_path: Path, second: int) -> None:
    """Children that take their time to stop (they ignore SIGTERM: the group kills them after its wait): a second
    signal meanwhile (an impatient operator, a supervisor asking again) is ignored, so every child is stopped and the
    broker too. Before, a second SIGTERM ended the demo in the middle of its clean-up, 143 all the same, its broker
    left running and its children behind it."""
    stubborn = tmp_path / "fake-python"
    stubborn.write_text("#!/bin/sh\ntrap '' TERM\nexec sleep 300\n")
    stubborn.chmod(0o755)
    out = tmp_path / "demo"
    with _started(stubborn, out, default_signals) as proc:
        pids = _wait_ready(proc, out)
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)  # the clean-up waits for the children now
        assert proc.poll() is None
        proc.send_signal(second)
        _, err = proc.communicate(timeout=60)
        text = err.decode(errors="replace")
        assert proc.returncode == 143, text  # the first signal's
        assert "demo: stopped everything it started" in text, text
        assert "Traceback" not in text, text
        assert left_running(pids, 0.0) == []
        assert (out / "broker-stopped").exists()


def test_a_hangup_under_nohup_does_not_stop_it(tmp_path: Path, fake_python: Path) -> None:
    out = tmp_path / "demo"
    with _started(fake_python, out, _ignore_hangup) as proc:
        pids = _wait_ready(proc, out)
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert proc.poll() is None
        assert all(alive(p) for p in pids.values())
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        assert proc.returncode == 143
        assert left_running(pids, 0.0) == []


def test_a_closed_terminal_stops_every_child(tmp_path: Path, fake_python: Path) -> None:
    """The demo on a terminal that closes once it is ready: the kernel sends it SIGHUP, and every line its clean-up
    writes to the terminal that is gone fails (EIO)."""
    out = tmp_path / "demo"
    try:
        with on_terminal([sys.executable, "-c", DEMO, str(fake_python), str(out)], cwd=ROOT, env=demo_env(),
                         before=default_signals) as demo:
            said = demo.read_until(READY, 60)
            assert READY in said, said[-500:]
            pids = _children(out)
            assert set(pids) == set(CHILDREN) and all(alive(p) for p in pids.values()), pids
            demo.close()  # the terminal closes
            status = demo.wait(30, every_s=0.05)
            assert status == 129, (f"the demo ended with {status} (-1: killed by the SIGHUP, with no clean-up; "
                                    f"1: an error, such as a line written to the terminal that is gone)")
            assert left_running(pids, 0.0) == []
            assert (out / "broker-stopped").exists()
    finally:
        _stop_children(out)
