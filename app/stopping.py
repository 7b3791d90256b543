"""Stopping background tasks within a bound: a task that does not end when cancelled is named and left behind.

A service's stop must end whatever its tasks do: one that catches its cancel, or waits on a peer that never answers,
must not hold the process past its grace period. A process whose stop left something running (a task, or a call in
a thread, which nothing can cancel) leaves by :func:`exit_now`: Python's own exit would wait for it again.

A process whose event loops come and go (the worker: its start wait's, then Faust's, a wait's again after a failed
start) takes its stop signals through one :class:`SignalRoute`, so that none finds them at their default between two
loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn


async def cancel_within(tasks: Sequence[asyncio.Task[Any]], timeout_s: float, what: str,
                        log: logging.Logger | None) -> list[str]:
    """Cancel ``tasks`` and wait ``timeout_s`` at most for them to end; those still running are left behind, and
    their names returned, sorted (and said in one WARNING on ``log``, unless it is None: ``<what> stopping: <names>
    still running …``). Their failures are retrieved, not raised; a cancel of the caller is not swallowed."""
    for t in tasks:
        t.cancel()
    if not tasks:
        return []
    done, running = await asyncio.wait(tasks, timeout=timeout_s)
    for t in done:
        if not t.cancelled():
            t.exception()
    names = sorted(t.get_name() for t in running)
    if names and log is not None:
        log.warning("%s stopping: %s; stopping without it", what, still_running(names, timeout_s))
    return names


def still_running(names: Sequence[str], timeout_s: float) -> str:
    """How :func:`cancel_within` says what it left behind.

    >>> still_running(["events", "retrain-a"], 20.0)
    'events, retrain-a still running 20 s after being cancelled'
    """
    return f"{', '.join(names)} still running {timeout_s:g} s after being cancelled"


def flush_output() -> None:
    """Write out what logging's handlers, ``sys.stdout`` and ``sys.stderr`` hold (``os._exit`` drops it); one that
    cannot be written (its reader gone, closed) is passed over."""
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def exit_now(code: int, line: str | None = None) -> NoReturn:
    """End the process at once with ``code``, after ``line`` (if any) on stdout and what logging and print hold
    written out: no wait for threads (a training in an executor's thread, which the interpreter's exit joins), tasks
    or ``asyncio.run``'s clean-up. Output that cannot be written (a pipe whose reader is gone) does not keep the
    process from ending."""
    if line is not None:
        with contextlib.suppress(Exception):
            print(line, flush=True)
    flush_output()
    os._exit(code)


class SignalRoute:
    """SIGTERM and SIGINT (``signals``) taken by one Python handler from its making to the process's end, and passed
    to whichever event loop the process runs at the time.

    An event loop's own handlers (``loop.add_signal_handler``) leave a signal at its default when removed, and when
    the loop closes: between two loops SIGTERM ended the process at once (143) and SIGINT was a
    ``KeyboardInterrupt``. Here each signal goes to the target :meth:`to` set, ``callback(signal)`` called on its
    loop (``call_soon_threadsafe``); with none (:meth:`hold`), or its loop closed, it is kept in :attr:`noted` --
    for the next target, which gets it as it is set, or for the caller to look at. One that comes while the target's
    loop does not run is kept as well (that loop may never run again), and called there too if it does.

    >>> route = SignalRoute(())  # takes no signal over: its handler is called by hand here
    >>> route._on_signal(signal.SIGTERM, None)
    >>> route.noted
    [<Signals.SIGTERM: 15>]
    """

    def __init__(self, signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self.noted: list[signal.Signals] = []
        self._target: tuple[asyncio.AbstractEventLoop, Callable[[signal.Signals], object]] | None = None
        for sig in signals:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        sig = signal.Signals(signum)
        target = self._target
        if target is not None:
            loop, callback = target
            with contextlib.suppress(RuntimeError):  # its loop closed: kept for the next
                loop.call_soon_threadsafe(callback, sig)
                if loop.is_running():
                    return
                # between two runs of its loop (mode's stop runs it step by step): after the last, it would never be
                # called; kept as well, for the next loop
        self.noted.append(sig)

    def to(self, loop: asyncio.AbstractEventLoop, callback: Callable[[signal.Signals], object]) -> None:
        """From now on each signal calls ``callback`` on ``loop``; those kept meanwhile do, in order, at once."""
        self._target = (loop, callback)
        noted, self.noted = self.noted, []
        for sig in noted:
            loop.call_soon_threadsafe(callback, sig)

    def hold(self) -> None:
        """From now on each signal is kept (:attr:`noted`) until the next :meth:`to`."""
        self._target = None
