"""Background work in slices, so that a request never waits long behind it on the event loop.

Requests are answered inside the loop's read callbacks. A background task that computes for 20 ms delays
every request arriving meanwhile by up to 20 ms; cut into slices of :data:`SLICE_S` with a yield between
them, it delays a request by at most about two slices (the slice running when the request arrives, and at
worst the one the loop had already scheduled before reading the socket).

Several background tasks (the view's feed, the snapshot rebuild, the release of an old snapshot, the
publisher) each pausing after its own slice would all be resumed by the same turn of the loop, one slice
each, back to back. So a pause waits for a baton, one per event loop, passed to one paused task per turn
in the order they paused: whatever the number of background tasks, a turn runs at most one resumed slice
(besides the tasks woken by their own I/O, which run their first slice then).

>>> import asyncio
>>> def steps():
...     for _ in range(3):
...         yield
...     return "built"
>>> asyncio.run(run_sliced(steps()))
'built'

Freeing is work too: dropping the last reference to a view of 5,000 nodes frees a few hundred thousand
objects in one go (tens of milliseconds). :func:`release_sliced` drops such references a few at a time.
"""

from __future__ import annotations

import asyncio
import collections
import time
import weakref
from collections.abc import Generator
from typing import TypeVar

SLICE_S = 0.0005  # longest stretch of background work between two yields to the event loop
RELEASE_CHUNK = 32  # references dropped between two clock reads by release_sliced

T = TypeVar("T")


class Baton:
    """Paused background tasks take turns: each turn of the event loop resumes at most one of them (FIFO).

    >>> async def worker(name, baton, out):
    ...     for i in range(2):
    ...         out.append(f"{name}{i}")
    ...         await baton.pause()
    >>> async def main():
    ...     baton, out = Baton(), []
    ...     await asyncio.gather(worker("a", baton, out), worker("b", baton, out))
    ...     return out
    >>> asyncio.run(main())
    ['a0', 'b0', 'a1', 'b1']
    """

    def __init__(self) -> None:
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._scheduled = False

    async def pause(self) -> None:
        """Yield to the loop; resume when it is this task's turn."""
        loop = asyncio.get_running_loop()
        turn: asyncio.Future[None] = loop.create_future()
        self._waiting.append(turn)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._pass)
        await turn

    def _pass(self) -> None:
        """One turn: wake the longest-waiting task (it runs in the next turn, and passes the baton on then)."""
        self._scheduled = False
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():  # a cancelled waiter has left
                turn.set_result(None)
                break
        if self._waiting:
            self._scheduled = True
            turn.get_loop().call_soon(self._pass)


_BATONS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Baton] = weakref.WeakKeyDictionary()


def baton() -> Baton:
    """The running loop's baton."""
    loop = asyncio.get_running_loop()
    b = _BATONS.get(loop)
    if b is None:
        b = _BATONS[loop] = Baton()
    return b


class Slicer:
    """Tells a background loop when its current slice is used up: check :meth:`due`, then ``await`` :meth:`pause`.

    ``due()`` is a clock read, cheap enough to call per item; ``pause()`` yields to the event loop and starts
    the next slice.
    """

    def __init__(self, slice_s: float = SLICE_S) -> None:
        if not slice_s > 0:
            raise ValueError(f"slice_s must be > 0 (got {slice_s})")
        self.slice_s = slice_s
        self._until = time.perf_counter() + slice_s

    def restart(self) -> None:
        """Start a fresh slice (after an ``await`` that yielded anyway)."""
        self._until = time.perf_counter() + self.slice_s

    def due(self) -> bool:
        return time.perf_counter() >= self._until

    async def pause(self) -> None:
        await baton().pause()
        self.restart()


async def run_sliced(steps: Generator[None, None, T], slicer: Slicer | None = None) -> T:
    """Drive a computation written as a generator of steps, yielding to the loop whenever a slice is used up."""
    slicer = slicer or Slicer()
    slicer.restart()
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        if slicer.due():
            await slicer.pause()


async def release_sliced(items: list[object], slicer: Slicer | None = None) -> None:
    """Drop ``items`` (the references that keep a large object graph alive) a few at a time, yielding to the
    loop whenever a slice is used up; ``items`` is empty afterwards, also when cancelled.

    >>> held = [object() for _ in range(100)]
    >>> asyncio.run(release_sliced(held)); held
    []
    """
    slicer = slicer or Slicer()
    slicer.restart()
    try:
        while items:
            del items[-RELEASE_CHUNK:]
            if slicer.due():
                await slicer.pause()
    finally:  # cancelled: the rest at once
        items.clear()
