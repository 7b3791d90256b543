"""Waiting between tries of something that failed for a passing reason (Redis restarting, a broker away).

:class:`Backoff` gives the waits: doubling from ``first_s`` up to ``max_s``, with ±20 % jitter so that
replicas that failed together do not retry together; :meth:`Backoff.reset` after a success.

>>> b = Backoff(first_s=0.5, max_s=4.0, jitter=0.0)
>>> [b.next() for _ in range(5)]
[0.5, 1.0, 2.0, 4.0, 4.0]
>>> b.reset(); b.next()
0.5
>>> b.failures = 5000  # hours of an outage: the wait stays at the cap (a float power would overflow)
>>> b.next()
4.0
>>> Backoff(first_s=0)
Traceback (most recent call last):
...
ValueError: first_s must be > 0 (got 0)
"""

from __future__ import annotations

import math
import random


class Backoff:
    """Exponential waits with jitter; ``failures`` counts the tries since the last :meth:`reset`."""

    def __init__(self, first_s: float = 0.5, max_s: float = 30.0, factor: float = 2.0, jitter: float = 0.2,
                 rng: random.Random | None = None) -> None:
        if not first_s > 0:
            raise ValueError(f"first_s must be > 0 (got {first_s})")
        if max_s < first_s:
            raise ValueError(f"max_s must be >= first_s (got {max_s} < {first_s})")
        if factor < 1:
            raise ValueError(f"factor must be >= 1 (got {factor})")
        if not 0 <= jitter < 1:
            raise ValueError(f"jitter must be in [0, 1) (got {jitter})")
        self.first_s, self.max_s, self.factor, self.jitter = first_s, max_s, factor, jitter
        self.rng = rng or random.Random()
        self.failures = 0

    @classmethod
    def upto(cls, max_s: float) -> Backoff:
        """Doubling from 0.5 s (or ``max_s`` when smaller) up to ``max_s`` (``RTT_RETRY_MAX_BACKOFF_S``).

        >>> Backoff.upto(0.1).first_s
        0.1
        """
        return cls(first_s=min(0.5, max_s), max_s=max_s)

    def next(self) -> float:
        """The wait before the next try (and count a failure)."""
        if self.failures * math.log(self.factor) >= math.log(self.max_s / self.first_s):
            base = self.max_s  # the cap reached (``factor ** failures`` itself overflows after ~1,000 failures)
        else:
            base = self.first_s * self.factor ** self.failures
        self.failures += 1
        if self.jitter:
            base *= 1.0 + self.rng.uniform(-self.jitter, self.jitter)
        return base

    def reset(self) -> None:
        self.failures = 0
