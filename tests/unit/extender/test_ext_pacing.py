"""Background slices take turns: one turn of the event loop resumes at most one paused background task."""

from __future__ import annotations

import asyncio
import collections

from app.extender.pacing import Slicer, baton, run_sliced


async def test_paused_tasks_are_resumed_one_per_loop_turn_in_order() -> None:
    turn = 0
    stop = False

    def count() -> None:  # runs once per turn of the loop
        nonlocal turn
        turn += 1
        if not stop:
            loop.call_soon(count)

    loop = asyncio.get_running_loop()
    loop.call_soon(count)
    ran: list[tuple[int, str]] = []

    async def background(name: str) -> None:
        slicer = Slicer(1e-9)  # every step uses up its slice
        for _ in range(20):
            ran.append((turn, name))
            if slicer.due():
                await slicer.pause()

    await asyncio.gather(*(background(n) for n in "abc"))
    stop = True
    per_turn = collections.Counter(t for t, _ in ran[3:])  # after each task's first (unpaused) slice
    assert max(per_turn.values()) == 1
    assert [n for _, n in ran[3:12]] == list("abcabcabc")  # round robin in the order they paused
    assert len(ran) == 60


async def test_a_cancelled_waiter_passes_its_turn_on() -> None:
    b = baton()
    assert baton() is b  # one per loop
    waiting = asyncio.ensure_future(b.pause())
    other = asyncio.ensure_future(b.pause())
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.wait_for(other, 1.0)  # resumed although the task ahead of it left
    assert waiting.cancelled()


async def test_run_sliced_still_finishes_beside_another_paced_task() -> None:
    def steps(n: int):  # type: ignore[no-untyped-def]
        for _ in range(n):
            yield
        return n

    results = await asyncio.gather(run_sliced(steps(50), Slicer(1e-9)), run_sliced(steps(30), Slicer(1e-9)))
    assert results == [50, 30]
