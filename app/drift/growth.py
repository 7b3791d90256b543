"""When a model key's sample count calls for a retrain (a cold start, or enough new samples since the last),
and how often one key may ask at all (:class:`Debounce`).

Two rules, on the samples of a key seen by one worker (``count``), checked every :data:`SAMPLE_CHECK_S`
(not at the error period's close: a new cluster's first models should not wait up to a period for it):

* **cold start** — the key has no model and ``count >= cold_start``; asked again only when the count has
  doubled since the last ask (the trainer may have found the samples too few or too poor);
* **growth** — the key has a model and ``count >= (1 + growth) · asked`` (``asked``: the count at the last
  ask, at least ``cold_start``). An early model is trained on few samples, often before the task
  features that vary with the load (running pods) have varied much; retraining as the history grows by
  a fixed fraction gives the trainer (which promotes a challenger only if it beats the champion) a few
  chances while the data is young, and geometrically fewer later: 200 → 300 → 450 → … samples.
  ``growth = 0`` turns the rule off.

>>> g = SampleGrowth(cold_start=200, growth=0.5)
>>> g.due("gCTF:gpu", 150, has_model=False), g.due("gCTF:gpu", 200, has_model=False)
(None, 'cold_start')
>>> g.asked("gCTF:gpu", 200)
>>> g.due("gCTF:gpu", 250, has_model=True), g.due("gCTF:gpu", 300, has_model=True)
(None, 'growth')
>>> g.asked("gCTF:gpu", 300); g.due("gCTF:gpu", 449, has_model=True), g.due("gCTF:gpu", 450, has_model=True)
(None, 'growth')
"""

from __future__ import annotations

import math
from collections.abc import Callable

COLD_START, GROWTH = "cold_start", "growth"
SAMPLE_CHECK_S = 0.25  # how often sample counts are checked against these rules (s; at most the error period)


def sample_check_s(error_period_s: float) -> float:
    """Seconds between two sample checks with this error period (the worker's timer; the simulator checks at
    the first completion or scrape round at or after each tick of it).

    >>> sample_check_s(5.0), sample_check_s(0.1)
    (0.25, 0.1)
    """
    return min(error_period_s, SAMPLE_CHECK_S)


class SampleGrowth:
    """Per model key, the sample count at the last retrain asked, and the rules above."""

    def __init__(self, cold_start: int, growth: float) -> None:
        if cold_start < 1:
            raise ValueError(f"cold_start must be >= 1 (got {cold_start})")
        if not (math.isfinite(growth) and growth >= 0):
            raise ValueError(f"growth must be >= 0 (got {growth})")
        self.cold_start = int(cold_start)
        self.growth = float(growth)
        self._asked: dict[str, int] = {}

    def threshold(self, key: str, *, has_model: bool) -> float:
        """The sample count at which the next retrain of ``key`` is due (``inf``: never)."""
        last = self._asked.get(key, 0)
        if not has_model:
            return float(max(self.cold_start, 2 * last))
        return (1.0 + self.growth) * max(last, self.cold_start) if self.growth > 0 else math.inf

    def due(self, key: str, count: int, *, has_model: bool) -> str | None:
        """The reason a retrain of ``key`` is due at ``count`` samples, or None."""
        if count < self.threshold(key, has_model=has_model):
            return None
        return GROWTH if has_model else COLD_START

    def asked(self, key: str, count: int) -> None:
        """Record that a retrain of ``key`` was asked at ``count`` samples."""
        self._asked[key] = int(count)

    def forget(self, drop: Callable[[str], bool]) -> None:
        """Forget the keys ``drop`` says (their app retired: its count starts again from 0)."""
        for key in [k for k in self._asked if drop(k)]:
            del self._asked[key]


class Debounce:
    """At most one event of the debounced ``reasons`` per key per ``interval_s`` (monotonic seconds).

    Drift events are debounced: several nodes of a class may signal the same drift within seconds, and
    one retrain answers them all. Cold-start and growth asks are not: :class:`SampleGrowth` already
    spaces them geometrically (50 → 75 → 112 … samples), and on a busy cluster (a thousand tasks a
    second) a 15 s debounce held every key at its first two models for the whole of a short run.

    >>> d = Debounce(60.0)
    >>> d.allow("k", 0.0), d.allow("k", 59.0), d.allow("k", 60.0), d.allow("k", 61.0, reason="growth")
    (True, False, True, True)
    """

    def __init__(self, interval_s: float, reasons: tuple[str, ...] = ("drift",)) -> None:
        self.interval_s = interval_s
        self.reasons = frozenset(reasons)
        self._last: dict[str, float] = {}

    def allow(self, key: str, now: float, reason: str = "drift") -> bool:
        if reason not in self.reasons:
            return True
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            return False
        self._last[key] = now
        return True

    def forget(self, drop: Callable[[str], bool]) -> None:
        """Forget the keys ``drop`` says (their app retired)."""
        for key in [k for k in self._last if drop(k)]:
            del self._last[key]
