"""Start the project's own processes as children and stop every one of them, also on Ctrl-C.

Each child runs ``python -m app.cli.child <command>`` (``rttsched <command>``) in a session (so a process group) of its
own with the parent's environment plus overrides; its output goes to a log file, so a failing child can be diagnosed.
A terminal's Ctrl-C or hang-up reaches the parent, which stops them (:meth:`ProcessGroup.stop`), not the children
directly. On Linux a child started from the main thread also gets SIGTERM when the parent dies without stopping it
(a SIGKILL), as the embedded broker does (:func:`app.kafka.embedded.die_with_parent`), and is killed with its process
group when it has not stopped ``orphan_stop_s`` (10 s) later (:mod:`app.cli.child`), so none stays behind under PID 1,
not even one whose stop hangs or that ignores SIGTERM.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from app.cli.child import PARENT_ENV
from app.errors import RttError
from app.kafka.embedded import ORPHAN_STOP_S, die_with_parent

log = logging.getLogger(__name__)


class ProcessError(RttError):
    """A child process exited early or never became ready."""


class ProcessGroup:
    """A set of child processes that are all stopped together (SIGTERM, then SIGKILL).

    Started from the main thread on Linux, a child also gets SIGTERM when this process dies, and SIGKILL (its process
    group) when it has not stopped ``orphan_stop_s`` later; started from another thread, it goes without either
    (Linux would send the signal when that thread ends: :func:`~app.kafka.embedded.die_with_parent`).
    """

    def __init__(self, log_dir: Path, env: Mapping[str, str] | None = None, *,
                 orphan_stop_s: float = ORPHAN_STOP_S) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, **(env or {})}
        self.orphan_stop_s = orphan_stop_s
        self.children: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, args: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        preexec = die_with_parent()
        child_env = {**self.env, **(env or {})}
        child_env.pop(PARENT_ENV, None)
        if preexec is not None:  # it gets the death signal: killed when it has not stopped in time (app.cli.child)
            child_env[PARENT_ENV] = f"{os.getpid()} {self.orphan_stop_s:g}"
        logfile = open(self.log_dir / f"{name}.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli.child", *args],
            stdout=logfile, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=child_env, start_new_session=True, preexec_fn=preexec,
        )
        logfile.close()
        self.children[name] = proc
        log.info("started %s (pid %d): rttsched %s", name, proc.pid, " ".join(args))
        return proc

    def log_tail(self, name: str, lines: int = 20) -> str:
        path = self.log_dir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def check(self) -> None:
        """Raise if any child has exited."""
        for name, proc in self.children.items():
            code = proc.poll()
            if code is not None:
                raise ProcessError(f"{name} exited with code {code}; last lines of its log:\n{self.log_tail(name)}")

    def wait_http(self, name: str, url: str, timeout_s: float = 60.0) -> None:
        """Wait until ``url`` answers 200, failing early if the child dies."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check()
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url, timeout=1) as resp:  # noqa: S310 - loopback URL we built
                    if resp.status == 200:
                        return
            time.sleep(0.2)
        raise ProcessError(f"{name} was not ready at {url} within {timeout_s:.0f}s:\n{self.log_tail(name)}")

    def stop(self, timeout_s: float = 10.0) -> None:
        for proc in reversed(list(self.children.values())):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for name, proc in self.children.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0fs; killing it", name, timeout_s)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        self.children.clear()

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, _et: type[BaseException] | None, _ev: BaseException | None, _tb: TracebackType | None) -> None:
        self.stop()
