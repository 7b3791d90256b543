"""A call answered in the same turn of the event loop as the task awaiting it is cancelled.

Python 3.11's ``asyncio.wait_for`` returns the awaited result and drops a cancel that comes in that turn: a loop
around it runs on after a stop cancelled it, and a stop that then awaits the loop waits without end. Code that must
stop when cancelled awaits under ``asyncio.timeout``, which keeps the cancel; these tests check it does. Also a task
slow to end when cancelled, which a stop waits for, and one that does not end when cancelled, which it gives up on.
"""

from __future__ import annotations

import asyncio
from typing import Any


class AnsweredAsCancelled:
    """An async callable that answers ``answer`` (or raises ``error``) and, in the same turn, cancels ``victim``
    (the task awaiting it, through ``asyncio.wait_for`` or not): the cancel of a stop that comes as the answer lands."""

    def __init__(self, answer: Any = None, error: BaseException | None = None) -> None:
        self.answer = answer
        self.error = error  # raised instead of answering: a try that failed
        self.victim: asyncio.Task[Any] | None = None
        self.calls = 0

    async def __call__(self, *_args: Any, **_kw: Any) -> Any:
        self.calls += 1
        loop = asyncio.get_running_loop()
        landed: asyncio.Future[Any] = loop.create_future()

        def land() -> None:  # the answer and the cancel in one turn, as a broker's answer and a SIGTERM can come
            if self.error is not None:
                landed.set_exception(self.error)
            else:
                landed.set_result(self.answer)
            if self.victim is not None:
                self.victim.cancel()

        loop.call_soon(land)
        return await landed


async def ends_cancelled(answered: AnsweredAsCancelled, coro: Any, timeout_s: float = 2.0) -> bool:
    """Run ``coro`` as the victim of ``answered``: True if it ended cancelled within ``timeout_s`` (a task that
    ran on is cancelled again, and its end awaited, so that no test leaves it behind)."""
    task = asyncio.get_running_loop().create_task(coro)
    answered.victim = task
    try:
        await asyncio.wait([task], timeout=timeout_s)
        return task.cancelled()
    finally:
        answered.victim = None
        for _ in range(100):  # a cancel can be lost again: cancelled until it ends
            task.cancel()
            await asyncio.wait([task], timeout=0.05)
            if task.done():
                break
        assert task.done(), "the task did not end when cancelled 100 times"
        await asyncio.gather(task, return_exceptions=True)


def slow_to_end(started: asyncio.Event) -> asyncio.Task[None]:
    """A task that sets ``started``, then waits until cancelled and takes half a second to end: a stop waits for it."""
    async def work() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.5)  # its cancel takes a while: the stop waits for it

    return asyncio.get_running_loop().create_task(work(), name="slow-to-end")


async def stubborn(released: asyncio.Event) -> None:
    """A task that does not end when cancelled (until ``released``): a stop gives up on it."""
    while not released.is_set():
        try:
            await released.wait()
        except asyncio.CancelledError:
            continue
