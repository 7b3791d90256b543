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

The same worker's start keeps a Kafka error that ends it (a broker gone since the worker's wait for it) for its
caller to say in one line, instead of Faust's ``Error:`` and mode's tracebacks (:class:`DeadlineWorker`).

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
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import faust
from aiokafka.errors import KafkaError

from app.kafka.quiet import handled_connect
from app.stopping import SignalRoute, flush_output
from app.streams.app import start_steps

log = logging.getLogger(__name__)

DEFAULT_STOP_TIMEOUT_S = 30.0
"""Below Kubernetes' grace period of the worker (k8s/worker.yaml: 45 s), so the worker says why before it is killed."""
EXIT_CODE = 1
PROBE_BUDGET_S = 2.0  # longest the deadline spends finding out whether the broker takes connections

_STOPPING = re.compile(r"^\[\^-*(?P<label>.+?)\]: Stopping\.\.\.$")
_CRASHED = re.compile(r"^\[\^-*.+?\]: Crashed reason=")  # mode's report of a crashed service
_STOPPING_CHILD = re.compile(r"^\[\^-*.+?\]: Error while stopping child ")
_UNRETRIEVED = "Future exception was never retrieved"  # asyncio's report of an error no one awaited


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
        flush_output()
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


class StartFailureSaid(logging.Filter):
    """Drops mode's reports, each with a traceback, of a Kafka error that ends the worker's start (the caller says it
    in one line, ``rttsched worker``): a service's ``Crashed reason=`` record, and, once the start has failed, the
    ``Error while stopping child`` of the consumer's thread, whose event loop closed as it crashed. And asyncio's
    report of the error the consumer's thread left for a start that had already gone on without it (that thread
    crashed before the start looked)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        msg = str(record.msg)
        if isinstance(exc, KafkaError) and (_CRASHED.match(msg) or msg.startswith(_UNRETRIEVED)):
            return False
        return not (self.failed and isinstance(exc, RuntimeError) and _STOPPING_CHILD.match(msg)
                    and str(exc) == "Event loop is closed")


class DeadlineWorker(faust.Worker):
    """``faust.Worker`` whose SIGTERM and SIGINT handlers arm ``deadline`` before Faust's own stop begins, and whose
    start, when a Kafka error ends it, keeps that error (:attr:`start_failure`) for the caller to say in one line.

    mode installs ``self._on_sigterm`` and ``self._on_sigint`` on the event loop (``install_signal_handlers``);
    overriding them keeps everything else of Faust's stop, and a quick stop ends the process before the
    deadline comes. Faust's progress spinner runs only on a terminal.

    A broker gone since the worker's wait for it fails Faust's start where a client first asks it: the producer's
    or the consumer's bootstrap (``KafkaConnectionError``). Faust logged that as ``Error:`` with its traceback, and
    for the consumer, whose client starts in a thread of its own, mode printed its traceback three times more
    (the thread's crash, Python's report of the thread's end, Faust's ``We experienced a crash!``). Until the
    consumer's client has started, and through the stop that follows a failed start, those reports of a Kafka error
    are left to the caller (with debug logging, Faust's are kept too); Faust's stop still stops every service it
    started. A Kafka error after that (the tables' recovery) ends no start: Faust reports it as before. A Kafka error
    that ends a start a stop signal had already cancelled is kept too, marked :attr:`failed_as_stopping`: the stop's
    doing, not a failure to say. The consumer's thread may crash before the start that began it has looked at it (on a
    loaded machine): Faust's start then ends without raising, the worker crashed with the error; that is the same
    failed start (it ended with Faust's crash, exit code 1, before).

    With ``signals``, SIGTERM and SIGINT come through that :class:`~app.stopping.SignalRoute` instead of handlers of
    the event loop's own (mode's), which go back to their defaults as the loop closes: those that came before Faust's
    handlers would have been installed are acted on then, at once; those after the loop's end are the route's.
    """

    def __init__(self, app: faust.App, *, deadline: StopDeadline, signals: SignalRoute | None = None,
                 **kwargs: Any) -> None:
        self.stop_deadline = deadline
        self.signals = signals
        self.start_failure: KafkaError | None = None
        self.failed_as_stopping = False
        self._starting = False
        self._start_quiet = contextlib.ExitStack()
        self._said = StartFailureSaid()
        self._excepthook = threading.excepthook
        super().__init__(app, **kwargs)
        if not self.stdout.isatty():  # Faust's start-up spinner writes its bells and cursor codes to a log file too
            self.spinner = None

    async def start(self) -> None:
        """Faust's start; a Kafka error that ends it is kept in :attr:`start_failure` (Faust's stop follows)."""
        self._starting = True
        if not logging.getLogger().isEnabledFor(logging.DEBUG):
            for handler in logging.getLogger().handlers:
                handler.addFilter(self._said)
                self._start_quiet.callback(handler.removeFilter, self._said)
        # aiokafka's connection-failure records too; all of it until the consumer's client has started: a Kafka error
        # after that (the broker gone during the tables' recovery) is a crash, not a failed start, and Faust says it
        self._start_quiet.enter_context(handled_connect())
        start_steps(self.app).after_consumer.callbacks.append(self._started_up)
        self._excepthook, threading.excepthook = threading.excepthook, self._thread_ended
        self._start_quiet.callback(self._restore_excepthook)
        thread = getattr(self.app.consumer, "_thread", None)  # the consumer's client runs in a mode ServiceThread
        if thread is not None:
            thread.on_crash = self._thread_crashed
        try:
            await super().start()
        except KafkaError as exc:
            self._start_failed(exc)
        else:
            # the consumer's thread crashed on a Kafka error before the start that began it looked at it (a loaded
            # machine's order): Faust's start ended without raising it, the worker crashed with it
            crashed = self.crash_reason
            if isinstance(crashed, KafkaError) and not start_steps(self.app).after_consumer.reached:
                self._start_failed(crashed)

    def _start_failed(self, exc: KafkaError) -> None:
        self.start_failure = exc
        self.failed_as_stopping = self.stop_deadline.armed  # a signal asked for the stop first
        self._said.failed = True
        log.debug("the worker's start failed", exc_info=exc)  # its traceback with -v: the caller says one line

    async def on_startup_finished(self) -> None:
        if start_steps(self.app).after_consumer.reached:  # not a start the consumer's crash ended (the stop says it)
            self._started_up()
        await super().on_startup_finished()

    def stop_and_shutdown(self) -> None:
        try:
            super().stop_and_shutdown()
        finally:
            self._started_up()
            if self.start_failure is not None:
                self._close_unused_thread_loop()

    def _close_unused_thread_loop(self) -> None:
        """Close the event loop mode made for the consumer's thread when that thread never started (the start
        failed before it): only the thread closes it, and the worker may make a new app after a failed start."""
        thread = getattr(self.app.consumer, "_thread", None)
        loop = getattr(thread, "thread_loop", None)
        if getattr(thread, "_thread", True) is None and loop is not None and not loop.is_closed():
            loop.close()

    def _shutdown_loop(self) -> None:
        if self.start_failure is not None and isinstance(self.crash_reason, KafkaError):
            self.crash_reason = None  # said by the caller, not raised again with Faust's "We experienced a crash!"
        super()._shutdown_loop()

    def _started_up(self) -> None:
        """The clients have started (or the start failed and was stopped): Faust's reports are its own again."""
        self._starting = False
        self._start_quiet.close()

    def _restore_excepthook(self) -> None:
        if threading.excepthook == self._thread_ended:  # not when a stop signal's deadline took it over since
            threading.excepthook = self._excepthook

    def _said_by_caller(self, exc: BaseException | None) -> bool:
        return (self._starting and isinstance(exc, KafkaError)
                and not logging.getLogger().isEnabledFor(logging.DEBUG))

    def _thread_crashed(self, msg: str, *fmt: Any, **kwargs: Any) -> None:
        """mode's report of a crashed service thread (it printed it to stderr with a traceback), as one line."""
        exc = sys.exc_info()[1]
        if self._said_by_caller(exc):
            log.info("%s (the start failed)", msg.format(*fmt))
            return
        log.error("%s", msg.format(*fmt), exc_info=exc if log.isEnabledFor(logging.DEBUG) else None)

    def _thread_ended(self, args: threading.ExceptHookArgs) -> None:
        if self._said_by_caller(args.exc_value):
            log.info("%s ended as the start failed: %r", args.thread.name if args.thread else "a thread",
                     args.exc_value)
            return
        self._excepthook(args)

    def _install_signal_handlers_unix(self) -> None:
        if self.signals is None:
            super()._install_signal_handlers_unix()
            return
        self.loop.add_signal_handler(signal.SIGUSR1, self._on_sigusr1)  # as mode's
        self.loop.add_signal_handler(signal.SIGUSR2, self._on_sigusr2)
        self.signals.to(self.loop, self._on_stop_signal)

    def _on_stop_signal(self, sig: signal.Signals) -> None:
        if sig == signal.SIGINT:
            self._on_sigint()
        else:
            self._on_sigterm()

    def _on_sigterm(self) -> None:
        self.stop_deadline.arm("SIGTERM")
        super()._on_sigterm()

    def _on_sigint(self) -> None:
        self.stop_deadline.arm("SIGINT")
        super()._on_sigint()
