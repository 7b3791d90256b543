""":class:`app.stopping.SignalRoute`: a signal reaches the event loop of the moment, is kept while there is none
(between two loops, after the last), and the next loop gets those kept, in order; the signal never finds its default
as a loop closes (an event loop's own handlers leave it so). Real signals sent to this process: SIGUSR1 and SIGUSR2,
whose handlers are put back after each test."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest

from app.stopping import SignalRoute

SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


@pytest.fixture
def route() -> Iterator[SignalRoute]:
    before = {sig: signal.getsignal(sig) for sig in SIGNALS}
    try:
        yield SignalRoute(SIGNALS)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def send(sig: signal.Signals) -> None:
    os.kill(os.getpid(), sig)  # its Python handler runs in this thread before the next line


def test_signals_go_to_the_loop_of_the_moment_and_are_kept_between_loops(route: SignalRoute) -> None:
    got: list[tuple[str, signal.Signals]] = []

    async def run(name: str, after: signal.Signals | None) -> None:
        route.to(asyncio.get_running_loop(), lambda sig: got.append((name, sig)))
        if after is not None:
            send(after)
        await asyncio.sleep(0.01)  # the callbacks run
        route.hold()

    send(signal.SIGUSR2)  # before any loop: kept
    assert route.noted == [signal.SIGUSR2]
    asyncio.run(run("first", signal.SIGUSR1))
    assert got == [("first", signal.SIGUSR2), ("first", signal.SIGUSR1)] and route.noted == []
    # between two loops, the first closed: kept, never the signal's default (which would end this process)
    assert signal.getsignal(signal.SIGUSR1) == route._on_signal
    send(signal.SIGUSR1)
    send(signal.SIGUSR2)
    assert route.noted == [signal.SIGUSR1, signal.SIGUSR2]
    asyncio.run(run("second", None))
    assert got[2:] == [("second", signal.SIGUSR1), ("second", signal.SIGUSR2)] and route.noted == []


def test_a_signal_for_a_loop_closed_since_is_kept(route: SignalRoute) -> None:
    loop = asyncio.new_event_loop()
    got: list[signal.Signals] = []
    route.to(loop, got.append)
    loop.close()  # its user ended without hold()
    send(signal.SIGUSR1)
    assert got == [] and route.noted == [signal.SIGUSR1]


def test_a_signal_for_a_loop_between_two_runs_is_kept_as_well(route: SignalRoute) -> None:
    """A loop run step by step (mode's stop: ``run_until_complete`` after ``run_until_complete``, then ``close``): a
    signal after its last step would never reach its callback."""
    loop = asyncio.new_event_loop()
    got: list[signal.Signals] = []
    route.to(loop, got.append)
    loop.run_until_complete(asyncio.sleep(0))  # a step; the loop does not run now
    send(signal.SIGUSR1)
    assert route.noted == [signal.SIGUSR1]  # kept for the next loop: this one may not run again
    loop.run_until_complete(asyncio.sleep(0))  # it did: called there too
    loop.close()
    assert got == [signal.SIGUSR1] and route.noted == [signal.SIGUSR1]
