"""Valid ranges of canonical metrics: a reading slightly outside is clamped, one far outside is rejected.

A canonical metric may declare a ``range`` (``[0, 1]`` for fractions). Readings are not exact: a counter rate
over a 1 s interval divides an increase read by one collector by a time read by another one (node_exporter's
``node_time_seconds``), so a fully stalled ``node_pressure_cpu_waiting_seconds_total`` reads 1.0016-1.019 s per
second, and a saturated disk's ``node_disk_io_time_seconds_total`` 1.02. Dropping those would make a
saturated resource vanish exactly when it matters, so:

- within ``tolerance`` outside the range (by default :data:`DEFAULT_TOLERANCE` of the range's width, 5 %; a
  metric may set its own in the mapping) a reading is **clamped** to the bound and counted;
- farther outside it is **rejected** (left out) and counted: DCGM's occasional 808334905 % utilisation
  is no reading at all.

The same rule applies per series (one GPU, one disk) before series are aggregated, and to the aggregate.

>>> t = RangeTally()
>>> [check(v, (0.0, 1.0), 0.05, "io_busy", t) for v in (0.5, 1.02, -0.01, 1.5)]
[0.5, 1.0, 0.0, None]
>>> dict(t.clamped), dict(t.rejected)
({'io_busy': 2}, {'io_busy': 1})
"""

from __future__ import annotations

import collections
import dataclasses

DEFAULT_TOLERANCE = 0.05  # fraction of a range's width
NON_NEGATIVE = (0.0, float("inf"))  # the range of a metric that declares none (no tolerance: -5 W is rejected)


@dataclasses.dataclass
class RangeTally:
    """How many readings of each canonical metric were clamped or rejected."""

    clamped: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    rejected: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)


def check(v: float, rng: tuple[float, float] | None, tolerance: float, metric: str,
          tally: RangeTally | None = None) -> float | None:
    """``v`` inside ``rng``; clamped when within ``tolerance`` outside; None (rejected) when farther."""
    if rng is None:
        return v
    lo, hi = rng
    if lo <= v <= hi:
        return v
    if lo - tolerance <= v <= hi + tolerance:
        if tally is not None:
            tally.clamped[metric] += 1
        return lo if v < lo else hi
    if tally is not None:
        tally.rejected[metric] += 1
    return None


def default_tolerance(rng: tuple[float, float]) -> float:
    """The tolerance of a range that declares none: :data:`DEFAULT_TOLERANCE` of its width.

    >>> default_tolerance((0.0, 1.0))
    0.05
    """
    return DEFAULT_TOLERANCE * (rng[1] - rng[0])
