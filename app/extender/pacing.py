"""Background work in slices, so that a request never waits long behind it on the event loop.

Requests are answered inside the loop's read callbacks. A background task that computes for 20 ms delays
every request arriving meanwhile by up to 20 ms; cut into slices of :data:`SLICE_S` with a yield between
them, it delays a request by at most about two slices (the slice running when the request arrives, and at
worst the one the loop had already scheduled before reading the socket).

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
import time
from collections.abc import Generator
from typing import TypeVar

SLICE_S = 0.0005  # longest stretch of background work between two yields to the event loop
RELEASE_CHUNK = 32  # references dropped between two clock reads by release_sliced

T = TypeVar("T")


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
        await asyncio.sleep(0)
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
