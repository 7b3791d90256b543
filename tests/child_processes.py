"""What the tests that start processes of their own share (``tests/unit`` and ``tests/integration`` alike): whether a
process still runs, a stand-in for the Python interpreter, the demo's environment and signal dispositions, the lines
read until one says so, a process whose output a thread gathers, a process on a terminal of its own that the test
closes, and a loopback HTTP GET.

Importable as ``child_processes`` from every test: ``tests/conftest.py`` puts this folder on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import os
import pty
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, AnyStr


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie nobody reaped yet (a reparented child, in a container whose init does not
    reap) counts as gone.

    >>> alive(os.getpid())
    True
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def gone_within(pid: int, seconds: float) -> bool:
    """Whether ``pid`` is gone (:func:`alive`) within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


def left_running(pids: Mapping[str, int], timeout_s: float = 10.0) -> list[str]:
    """The processes of ``pids`` (name: pid) still running after ``timeout_s``, as ``name (pid)``; looked at once
    at least.

    >>> left_running({"me": os.getpid()}, 0.0) == [f"me ({os.getpid()})"]
    True
    """
    deadline = time.monotonic() + timeout_s
    while True:
        left = [f"{name} ({pid})" for name, pid in pids.items() if alive(pid)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def demo_env() -> dict[str, str]:
    """This environment for ``rttsched demo``, which starts a broker and uses a registry of its own: without the
    settings that point at a broker or Redis elsewhere, its output unbuffered.

    >>> env = demo_env()
    >>> env["PYTHONUNBUFFERED"], "REDIS_URL" in env
    ('1', False)
    """
    env = {k: v for k, v in os.environ.items() if k not in ("RTT_KAFKA_BOOTSTRAP", "REDIS_URL", "RTT_TOPIC_PREFIX")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def default_signals() -> None:
    """In the demo before exec: Ctrl-C and hang-up as a terminal delivers them (a test run in the background, or
    under nohup, has them ignored, and an ignored signal stays ignored across exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def sleeper(tmp_path: Path) -> Path:
    """A stand-in for the Python interpreter that ignores its arguments and sleeps: a shell script that execs
    ``sleep`` (the parent-death signal outlives an exec)."""
    path = tmp_path / "fake-python"
    path.write_text("#!/bin/sh\nexec sleep 300\n")
    path.chmod(0o755)
    return path


def lines_until(stream: IO[AnyStr], last: Callable[[AnyStr], bool], timeout_s: float) -> list[AnyStr]:
    """The lines read from ``stream`` up to the first for which ``last`` holds (an empty line is its end), or until
    ``timeout_s`` passed.

    >>> import io
    >>> lines_until(io.StringIO("one\\nready\\nthree\\n"), lambda line: line.startswith("ready"), 5)
    ['one\\n', 'ready\\n']
    """
    said: list[AnyStr] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = stream.readline()
        said.append(line)
        if last(line):
            break
    return said


class Gathered:
    """A child process in a session of its own (``start_new_session``), what it writes to its piped stdout (its stderr
    with it, where the test sent it there) gathered line by line by a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def read_to_end(self) -> None:
        """Waits up to 5 s for the thread to have read the output to its end (the process has ended)."""
        self._reader.join(5)

    def kill(self) -> None:
        """The process's session killed unless it ended, the process reaped, its output read to the end."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self.read_to_end()


@dataclass
class Terminal:
    """A process on a terminal of its own (:func:`on_terminal`): ``fd`` is the terminal's side of the test (-1 once
    closed), ``status`` the process's exit code once it ended."""

    pid: int
    fd: int
    status: int | None = None

    def read_until(self, marker: bytes, timeout_s: float) -> bytes:
        """What the process wrote to the terminal until it wrote ``marker``, ended or ``timeout_s`` passed."""
        said = b""
        deadline = time.monotonic() + timeout_s
        while marker not in said and time.monotonic() < deadline:
            try:
                said += os.read(self.fd, 4096)
            except OSError:  # the process ended: its side of the terminal closed
                break
        return said

    def close(self) -> None:
        """The terminal closes: the kernel sends the process SIGHUP, and what it writes to the terminal fails."""
        os.close(self.fd)
        self.fd = -1

    def wait(self, timeout_s: float, every_s: float) -> int | None:
        """The process's exit code once it ended, looked for every ``every_s`` for up to ``timeout_s``; None while
        it runs."""
        deadline = time.monotonic() + timeout_s
        while self.status is None and time.monotonic() < deadline:
            done, raw = os.waitpid(self.pid, os.WNOHANG)
            self.status = os.waitstatus_to_exitcode(raw) if done else None
            time.sleep(every_s)
        return self.status


@contextlib.contextmanager
def on_terminal(argv: list[str], *, cwd: Path, env: dict[str, str], before: Callable[[], None]) -> Iterator[Terminal]:
    """``argv`` (``argv[0]`` a path) exec'd on a pseudo-terminal of its own, in ``cwd`` with ``env``, ``before``
    called in the child first; whatever the test did, the terminal is closed and the process, unless it ended,
    killed and reaped."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child, exec'd at once
        try:
            before()
            os.chdir(cwd)
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    terminal = Terminal(pid, fd)
    try:
        yield terminal
    finally:
        if terminal.fd >= 0:
            os.close(terminal.fd)
        if terminal.status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def http_get(port: int, path: str) -> tuple[int, bytes]:
    """``GET http://127.0.0.1:<port><path>``: the status and body, an error status's too; ``(0, b"")`` when nothing
    answers (refused, reset, timed out after 5 s)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:  # noqa: S310 - loopback
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""
