"""Counter increases between two scrapes of one target, with counter resets.

Each series (sample name + labels) keeps its last value and the time it was read. The next reading gives a
:class:`Delta` (increase and seconds) or ``None``:

- first sighting of a series: ``None`` (nothing to compare with);
- a value lower than the previous one is a **counter reset** (exporter or node restarted, counter wrapped):
  ``None`` for that one interval, and the new value becomes the baseline. Prometheus' ``rate()`` instead
  assumes the counter restarted from 0 and counts the new value as the increase; over a 1 s interval that
  mixes two processes, and for CPU shares a partial count from a restarted exporter would be misleading, so
  the interval is skipped;
- time that did not move forward (same timestamp, or the time source changed): ``None``;
- an exporter's clock that jumped (its interval more than :data:`JUMP_S` and half of it away from the bridge's
  own, monotonic one: a node whose clock was set, a page stamped by another host): ``None`` for that interval,
  counted in ``clock_jumps`` — dividing one second's increase by a day's interval reads as an idle node.

A series missing from a scrape is forgotten; if it comes back, it starts again from a first sighting.

>>> t = CounterTracker()
>>> t.observe({"a": 10.0}, 0.0, "bridge")
{'a': None}
>>> t.observe({"a": 25.0}, 5.0, "bridge")["a"].rate
3.0
>>> t.observe({"a": 4.0}, 10.0, "bridge")            # reset: skipped
{'a': None}
>>> t.observe({"a": 6.0}, 11.0, "bridge")["a"].rate
2.0
>>> e = CounterTracker()
>>> e.observe({"a": 0.0}, 1000.0, "exporter", bridge_t=5.0); e.observe({"a": 1.0}, 1001.0, "exporter", bridge_t=6.0)
{'a': None}
{'a': Delta(increase=1.0, seconds=1.0)}
>>> e.observe({"a": 2.0}, 1e7, "exporter", bridge_t=7.0), e.clock_jumps     # the node's clock set a year ahead
({'a': None}, 1)
>>> e.observe({"a": 3.0}, 1e7 + 1.0, "exporter", bridge_t=8.0)["a"].rate    # from the new clock on
1.0
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping

SeriesKey = Hashable
JUMP_S = 5.0  # an exporter's interval this far (and half its length) from the bridge's own is a clock jump


@dataclasses.dataclass(frozen=True, slots=True)
class Delta:
    """Increase of a counter over ``seconds``."""

    increase: float
    seconds: float

    @property
    def rate(self) -> float:
        """Increase per second."""
        return self.increase / self.seconds


class CounterTracker:
    """Last value and time of each counter series of one scrape target."""

    def __init__(self) -> None:
        self._last: dict[SeriesKey, float] = {}
        self._t: float | None = None
        self._source: str | None = None
        self._own_t: float | None = None  # the bridge's monotonic time of the previous scrape
        self.resets = 0
        self.clock_jumps = 0

    def observe(self, values: Mapping[SeriesKey, float], t: float, source: str,
                bridge_t: float | None = None) -> dict[SeriesKey, Delta | None]:
        """Record one scrape's counter values read at time ``t`` (seconds, from clock ``source``; ``bridge_t``:
        the bridge's monotonic time of the scrape, against which an exporter's clock is checked).

        Returns the :class:`Delta` of every series since the previous scrape, or ``None`` where there is none.
        """
        dt = None
        if self._t is not None and self._source == source and t > self._t:
            dt = t - self._t
            if source != "bridge" and bridge_t is not None and self._own_t is not None:
                own = bridge_t - self._own_t
                if abs(dt - own) > max(JUMP_S, 0.5 * own):
                    dt = None
                    self.clock_jumps += 1
        self._own_t = bridge_t
        out: dict[SeriesKey, Delta | None] = {}
        for key, value in values.items():
            prev = self._last.get(key)
            if prev is None or dt is None:
                out[key] = None
            elif value < prev:
                self.resets += 1
                out[key] = None
            else:
                out[key] = Delta(value - prev, dt)
        self._last = dict(values)
        self._t, self._source = t, source
        return out

    def __len__(self) -> int:
        return len(self._last)
