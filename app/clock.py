"""Clock seam: production code asks a Clock for the time, tests inject a ManualClock."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock seconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Monotonic seconds, for durations."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that only moves when told to.

    >>> c = ManualClock(100.0)
    >>> c.advance(2.5).now()
    102.5
    """

    def __init__(self, start: float = 0.0) -> None:
        self._t = float(start)

    def now(self) -> float:
        return self._t

    def monotonic(self) -> float:
        return self._t

    def advance(self, seconds: float) -> ManualClock:
        if seconds < 0:
            raise ValueError("seconds must be >= 0")
        self._t += seconds
        return self
