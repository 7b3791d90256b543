"""The demo's children (:class:`app.cli.processes.ProcessGroup`) die with it.

Each child runs in a session of its own, so a terminal's signals reach only the parent, which stops them; a parent
SIGKILLed (or dead of a signal it did not handle) left them running under PID 1. On Linux a child started from the
main thread now gets SIGTERM when its parent dies, as the embedded broker does.

The children here are a stand-in for ``python -m app.cli.main ...``: ``sys.executable`` is a shell script that
execs ``sleep`` (the parent-death signal outlives an exec).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from child_processes import alive, gone_within, sleeper

from app.cli.processes import ProcessGroup

LINUX = sys.platform.startswith("linux")
ROOT = Path(__file__).resolve().parents[2]


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


PARENT = """
import sys, time
from pathlib import Path
from app.cli.processes import ProcessGroup
sys.executable = sys.argv[1]
group = ProcessGroup(Path(sys.argv[2]))
print(group.start("child", ["worker"]).pid, flush=True)
time.sleep(300)
"""


@pytest.mark.skipif(not LINUX, reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_goes_when_its_parent_is_killed(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(sleeper(tmp_path)), str(tmp_path / "logs")],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
    child: int | None = None
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line.strip().isdigit(), f"the parent did not start its child (exit code {parent.poll()})"
        child = int(line)
        assert alive(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        assert gone_within(child, 5), f"the child (pid {child}) outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            _kill_group(parent.pid)
        parent.wait(10)
        if child is not None and alive(child):  # a session of its own: its process group
            _kill_group(child)


def test_a_child_started_from_a_thread_that_ends_keeps_running(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Linux sends the parent-death signal when the *thread* that started the child ends: started from another
    thread (``asyncio.to_thread``, as the fault stack restarts its children), a child goes without."""
    monkeypatch.setattr(sys, "executable", str(sleeper(tmp_path)))
    group = ProcessGroup(tmp_path / "logs")
    try:
        starter = threading.Thread(target=group.start, args=("child", ["worker"]), name="starts-the-child")
        starter.start()
        starter.join(30)
        proc = group.children["child"]
        time.sleep(0.5)  # a parent-death signal would have arrived by now
        assert proc.poll() is None
    finally:
        group.stop(timeout_s=5)  # SIGTERM, then SIGKILL


# The interpreter of a child whose command ignores SIGTERM (or whose stop never ends): the module the group runs, with
# the command's main a long sleep.
IGNORES_TERM = """
import runpy, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
import app.cli.main
app.cli.main.main = lambda argv=None: time.sleep(300) or 0
module = sys.argv[sys.argv.index("-m") + 1]
if module == "app.cli.main":
    sys.exit(app.cli.main.main())
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""

PARENT_OF_STUBBORN = """
import sys, time
from pathlib import Path
from app.cli.processes import ProcessGroup
sys.executable = sys.argv[1]
group = ProcessGroup(Path(sys.argv[2]), orphan_stop_s=float(sys.argv[3]))
print(group.start("child", ["worker"]).pid, flush=True)
time.sleep(300)
"""


@pytest.mark.skipif(not LINUX, reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_that_ignores_sigterm_is_killed_when_its_parent_is(tmp_path: Path) -> None:
    """The death signal is SIGTERM and nothing followed it: a child that ignored it, or whose stop hung, ran on under
    PID 1. Now it has ``orphan_stop_s`` to stop, then it is killed (SIGKILL), saying so in its log."""
    script = tmp_path / "ignores_term.py"
    script.write_text(IGNORES_TERM)
    python = tmp_path / "stubborn-python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    python.chmod(0o755)
    stop_s = 1.5
    parent = subprocess.Popen([sys.executable, "-c", PARENT_OF_STUBBORN, str(python), str(tmp_path / "logs"),
                               str(stop_s)], cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
    child: int | None = None
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line.strip().isdigit(), f"the parent did not start its child (exit code {parent.poll()})"
        child = int(line)
        time.sleep(1.0)  # the child's interpreter is up, SIGTERM ignored
        assert alive(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        time.sleep(0.3)
        assert alive(child), "killed at once: its stop had no time"
        assert gone_within(child, stop_s + 10), f"the child (pid {child}) outlived its SIGKILLed parent"
        log = (tmp_path / "logs" / "child.log").read_text()
        assert f"still running {stop_s:.0f} s after its parent (pid {parent.pid}) died: killed" in log, log
    finally:
        if parent.poll() is None:
            _kill_group(parent.pid)
        parent.wait(10)
        if child is not None and alive(child):
            _kill_group(child)
