"""A sweep of the dead-letter marks directory runs in a thread, one at a time, and the trainer's stop ends it: closing
the marks stops a sweep running at the mark it is on and waits for its thread, so neither a second sweep nor one the
stop left running holds the process after it (asyncio.run waits for the thread without bound). The sweep's reads are
held on threading events, not timed."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from app.clock import ManualClock
from app.trainer.dead_letters import DirectoryMarks


class Held:
    """DirectoryMarks._expiry, counting its calls and the threads they came from; the first one waits for release."""

    def __init__(self) -> None:
        self.read = DirectoryMarks._expiry
        self.entered, self.release = threading.Event(), threading.Event()
        self.calls: list[str] = []
        self.threads: set[int] = set()

    def __call__(self, path: Path) -> float | None:
        self.calls.append(path.name)
        self.threads.add(threading.get_ident())
        if len(self.calls) == 1:
            self.entered.set()
            assert self.release.wait(30)
        return self.read(path)


async def expired_marks(path: Path, clock: ManualClock, n: int) -> DirectoryMarks:
    marks = DirectoryMarks(path, clock)
    for i in range(n):
        await marks.add(f"t.0.{i}.-1.00000000", ttl_s=10.0)  # the first add's sweep: nothing there yet
    clock.advance(10.0)
    return marks


async def sweep_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                     ) -> tuple[Path, DirectoryMarks, Held, asyncio.Task[int]]:
    """Five expired marks in ``tmp_path``/dead-letters whose sweep runs in a task, its thread held as it reads its
    first mark: their folder, the marks, the hold and the sweep's task."""
    clock = ManualClock(1_800_000_000.0)
    path = tmp_path / "dead-letters"
    marks = await expired_marks(path, clock, 5)
    held = Held()
    monkeypatch.setattr(DirectoryMarks, "_expiry", staticmethod(held))
    sweeping = asyncio.create_task(marks.sweep())
    assert await asyncio.to_thread(held.entered.wait, 30)  # the sweep's thread reads its first mark
    return path, marks, held, sweeping


async def test_closing_stops_a_sweep_at_the_mark_it_is_on_and_waits_for_its_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, marks, held, sweeping = await sweep_held(tmp_path, monkeypatch)
    sweeping.cancel()  # the trainer's stop cancels the task waiting for it ...
    closing = asyncio.create_task(marks.close())  # ... then closes the marks
    for _ in range(20):
        await asyncio.sleep(0)
    assert not closing.done()  # waits for the sweep's thread
    held.release.set()
    await asyncio.wait_for(closing, 30)
    # the thread ended with the mark it was on (read, read again and removed); the four others are left
    assert len(held.calls) == 2 and len(list(path.iterdir())) == 4
    assert await marks.sweep() == 0 and len(held.calls) == 2  # closed: no sweep starts


async def test_a_sweep_asked_for_while_one_runs_waits_for_that_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, marks, held, first = await sweep_held(tmp_path, monkeypatch)
    second = asyncio.create_task(marks.sweep())  # 1,000 marks stored during a long sweep ask for another
    for _ in range(20):
        await asyncio.sleep(0)
    held.release.set()
    assert await asyncio.wait_for(asyncio.gather(first, second), 30) == [5, 5]  # one sweep's count, for both
    assert len(held.threads) == 1 and list(path.iterdir()) == []
