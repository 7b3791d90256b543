"""A deadline on the worker's stop: after SIGTERM or SIGINT it stops as Faust does, or exits when that takes too long.

Faust stops its services one after the other and waits for each: with the broker gone, its Kafka consumer
thread, the producer's flush and the offset commits wait for an answer that never comes (a minute per
service and more), and Kubernetes kills the pod at the end of its grace period without a word of why.
:class:`DeadlineWorker` is a ``faust.Worker`` whose SIGTERM and SIGINT handlers also arm a
:class:`StopDeadline`: a daemon thread that, unless the process has ended first, logs one ERROR line
saying what the stop still waited for and exits with :data:`EXIT_CODE` (``os._exit``: Python's own exit
would wait for Faust's consumer thread, which is not a daemon).

While the stop lasts, a thread that ends with an exception (Faust's consumer thread, cancelled with the broker
gone) is logged as one line instead of Python's traceback.

Exiting there loses nothing stored: a checkpoint writes its rows, then the read positions, then a marker,
each group only once the broker acknowledged the one before (:mod:`app.streams.changelog`), and the worker
writes no checkpoint file of its own. What was read or computed after the last stored checkpoint is read
again on the next start.

>>> line = StopDeadline(3.0, "127.0.0.1:9").message("SIGTERM", "the broker at 127.0.0.1:9 does not answer")
>>> line[:96]
'worker did not finish stopping within 3 s of SIGTERM (the broker at 127.0.0.1:9 does not answer)'
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import faust

log = logging.getLogger(__name__)

DEFAULT_STOP_TIMEOUT_S = 30.0
"""Below Kubernetes' grace period of the worker (k8s/worker.yaml: 45 s), so the worker says why before it is killed."""
EXIT_CODE = 1
PROBE_BUDGET_S = 2.0  # longest the deadline spends finding out whether the broker takes connections

_STOPPING = re.compile(r"^\[\^-*(?P<label>.+?)\]: Stopping\.\.\.$")


class StopProgress(logging.Handler):
    """Remembers the last service mode said it began stopping (its ``[^--Name]: Stopping...`` line).

    Faust stops its services one at a time, so when the stop hangs the last one begun is, or holds, the one
    that waits.

    >>> p = StopProgress()
    >>> p.emit(logging.makeLogRecord({"msg": "[^---AIOKafkaConsumerThread]: Stopping..."}))
    >>> p.last
    'AIOKafkaConsumerThread'
    """

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        found = _STOPPING.match(str(record.msg))
        if found:
            self.last = found.group("label")


def addresses(bootstrap: str) -> list[tuple[str, int]]:
    """``host:port[,host:port]`` as (host, port) pairs; an IPv6 host loses its brackets.

    >>> addresses("kafka-0:9092, [::1]:9093")
    [('kafka-0', 9092), ('::1', 9093)]
    """
    out = []
    for part in (p.strip() for p in bootstrap.split(",")):
        host, _, port = part.rpartition(":")
        if host and port.isdigit():
            out.append((host.strip("[]"), int(port)))
    return out


def broker_takes_connections(bootstrap: str, budget_s: float = PROBE_BUDGET_S) -> bool:
    """Whether any address of ``bootstrap`` takes a TCP connection within ``budget_s`` in all."""
    until = time.monotonic() + budget_s
    for host, port in addresses(bootstrap):
        left = until - time.monotonic()
        if left <= 0:
            break
        with contextlib.suppress(OSError):
            socket.create_connection((host, port), timeout=min(1.0, left)).close()
            return True
    return False


def _flush_output() -> None:
    """Write out what logging and print hold in buffers: ``os._exit`` drops them."""
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def log_thread_end(args: threading.ExceptHookArgs) -> None:
    """One line for a thread that ended with an exception (its traceback only with debug logging).

    A thread cancelled by the stop (``CancelledError``) is expected and logged at INFO, anything else at ERROR.
    """
    name = args.thread.name if args.thread is not None else "a thread"
    if issubclass(args.exc_type, asyncio.CancelledError):
        log.info("%s was cancelled by the stop", name)
        return
    exc_info = args.exc_value if log.isEnabledFor(logging.DEBUG) else None
    log.error("%s ended during the stop: %s: %s", name, args.exc_type.__name__, args.exc_value, exc_info=exc_info)


class StopDeadline:
    """Once armed by a stop signal, exits the process ``timeout_s`` later unless it has ended by then.

    ``exit`` is ``os._exit`` (tests pass their own); the reason in the ERROR line names the last service that
    began stopping and whether the broker of ``bootstrap`` takes connections.
    """

    def __init__(self, timeout_s: float, bootstrap: str, *, exit: Callable[[int], Any] = os._exit) -> None:
        self.timeout_s = timeout_s
        self.bootstrap = bootstrap
        self.progress = StopProgress()
        self._exit = exit
        self._disarmed = threading.Event()
        self._thread: threading.Thread | None = None
        self._excepthook = threading.excepthook

    @property
    def armed(self) -> bool:
        return self._thread is not None

    def arm(self, signal_name: str) -> None:
        """Start the countdown (once: a second signal keeps the first deadline)."""
        if self._thread is not None:
            return
        logging.getLogger().addHandler(self.progress)
        self._excepthook, threading.excepthook = threading.excepthook, log_thread_end
        log.info("%s: stopping; exiting without a finished shutdown if that takes over %g s",
                 signal_name, self.timeout_s)
        self._thread = threading.Thread(target=self._watch, args=(signal_name,), name="stop-deadline", daemon=True)
        self._thread.start()

    def disarm(self) -> None:
        """Call the countdown off (for a caller that outlives the worker it ran: tests)."""
        self._disarmed.set()
        logging.getLogger().removeHandler(self.progress)
        threading.excepthook = self._excepthook

    def _watch(self, signal_name: str) -> None:
        if self._disarmed.wait(self.timeout_s):
            return
        log.error("%s", self.message(signal_name, self.reason()))
        _flush_output()
        self._exit(EXIT_CODE)

    def reason(self) -> str:
        """What the stop still waited for, as far as can be told: the service, and whether the broker takes a
        connection (one that does, yet hangs, answers nothing either)."""
        parts = [f"still stopping {self.progress.last}"] if self.progress.last else []
        taking = broker_takes_connections(self.bootstrap)
        parts.append(f"the broker at {self.bootstrap} {'takes connections' if taking else 'does not answer'}")
        return "; ".join(parts)

    def message(self, signal_name: str, reason: str) -> str:
        return (f"worker did not finish stopping within {self.timeout_s:g} s of {signal_name} ({reason});"
                f" exiting with code {EXIT_CODE} without finishing its shutdown: read positions and state not"
                " checkpointed yet are read again on the next start")


class DeadlineWorker(faust.Worker):
    """``faust.Worker`` whose SIGTERM and SIGINT handlers arm ``deadline`` before Faust's own stop begins.

    mode installs ``self._on_sigterm`` and ``self._on_sigint`` on the event loop (``install_signal_handlers``);
    overriding them keeps everything else of Faust's stop, and a quick stop ends the process before the
    deadline comes. Faust's progress spinner runs only on a terminal.
    """

    def __init__(self, app: faust.App, *, deadline: StopDeadline, **kwargs: Any) -> None:
        self.stop_deadline = deadline
        super().__init__(app, **kwargs)
        if not self.stdout.isatty():  # Faust's start-up spinner writes its bells and cursor codes to a log file too
            self.spinner = None

    def _on_sigterm(self) -> None:
        self.stop_deadline.arm("SIGTERM")
        super()._on_sigterm()

    def _on_sigint(self) -> None:
        self.stop_deadline.arm("SIGINT")
        super()._on_sigint()
