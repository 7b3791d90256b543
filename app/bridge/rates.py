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
  counted in ``clock_jumps`` — dividing one second's increase by a day's interval reads as an idle node;
- a page of another host than the previous one (``other_host``, from :mod:`app.bridge.identity`: two exporters
  behind one address, a node that rebooted): ``None`` for that interval, counted in ``host_changes`` -- one
  host's counter less another's is no increase;
- counters that went **back and forth**: most series that reset in the previous interval — a tenth of the
  page's series at least (:data:`BOUNCE_SHARE`) — are back at or above their value before it. A restarted
  counter cannot regrow its whole past in one interval: the page in
  between was another counter's (two exporters behind one address, pages without an identity). ``None`` for
  that interval, counted in ``bounces``.

:attr:`CounterTracker.skipped` says why the last interval gave no rates (``clock_jump``, ``host_changed``,
``counter_bounce``), or ``counter_reset`` when only some series reset.

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
>>> b = CounterTracker()                     # two exporters in turn: one counted 1000, the other 50
>>> [b.observe({"a": v}, float(t), "bridge")["a"] for t, v in enumerate((1000.0, 50.0, 1001.0))], b.skipped
([None, None, None], 'counter_bounce')
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping

SeriesKey = Hashable
BOUNCE_SHARE = 0.1  # counters back and forth count only when this share of the page's series reset at least
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
        self._reset_from: dict[SeriesKey, float] = {}  # series that reset in the last interval: value before
        self.resets = 0
        self.clock_jumps = 0
        self.host_changes = 0
        self.bounces = 0
        self.skipped: str | None = None
        self.detail = ""  # what ``skipped`` saw

    def observe(self, values: Mapping[SeriesKey, float], t: float, source: str,
                bridge_t: float | None = None, *, other_host: bool = False) -> dict[SeriesKey, Delta | None]:
        """Record one scrape's counter values read at time ``t`` (seconds, from clock ``source``; ``bridge_t``:
        the bridge's monotonic time of the scrape, against which an exporter's clock is checked;
        ``other_host``: the page is of another host than the previous one).

        Returns the :class:`Delta` of every series since the previous scrape, or ``None`` where there is none.
        """
        dt = None
        self.skipped, self.detail = None, ""
        if other_host:
            self.host_changes += 1
            self.skipped = "host_changed"
        elif self._t is not None and self._source == source and t > self._t:
            dt = t - self._t
            if source != "bridge" and bridge_t is not None and self._own_t is not None:
                own = bridge_t - self._own_t
                if abs(dt - own) > max(JUMP_S, 0.5 * own):
                    self.clock_jumps += 1
                    self.skipped = "clock_jump"
                    self.detail = f"its clock moved {dt:.6g} s while the bridge's moved {own:.6g} s"
                    dt = None
        if dt is not None and self._bounced(values):
            dt = None
            self.bounces += 1
            self.skipped = "counter_bounce"
            self.detail = (f"{len(self._reset_from)} counter(s) that went back last interval are forward again: "
                           "another exporter answered in between")
        self._own_t = bridge_t
        self._reset_from = {}
        out: dict[SeriesKey, Delta | None] = {}
        for key, value in values.items():
            prev = self._last.get(key)
            if prev is None or dt is None:
                out[key] = None
            elif value < prev:
                self.resets += 1
                self._reset_from[key] = prev
                self.skipped = "counter_reset"
                out[key] = None
            else:
                out[key] = Delta(value - prev, dt)
        self._last = dict(values)
        self._t, self._source = t, source
        if self.skipped == "counter_reset":
            self.detail = f"{len(self._reset_from)} counter(s) went back (a restart?)"
        return out

    def _bounced(self, values: Mapping[SeriesKey, float]) -> bool:
        """Whether most series that reset in the last interval are back at or above their value before it, and
        they were a tenth of the page's series at least (another host's page sets back about half of them; one
        interface's small counter that reset and regrew is not another host)."""
        if BOUNCE_SHARE * len(self._last) > len(self._reset_from):
            return False
        back = sum(1 for key, before in self._reset_from.items() if values.get(key, -math.inf) >= before)
        return back > 0 and 2 * back > len(self._reset_from)

    def __len__(self) -> int:
        return len(self._last)
