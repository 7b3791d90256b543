"""Page-Hinkley test for an increase of the per-window prediction error, with a level-shift rule.

For each observation ``x_t`` (the relative error of one 5 s window of one node × app):

``mean_t = mean(x_1..x_t)``
``m_t = alpha * m_{t-1} + (x_t - mean_t - delta)``
``M_t = min(m_1..m_t)``
``PH_t = m_t - M_t``  (:attr:`PageHinkley.cumulative`)

A drift is signalled when ``PH_t > threshold`` and at least ``min_instances`` windows were seen
(river's one-sided formulation), or by the **level-shift rule**: once the detector has its reference
(``min_instances`` windows before this one), a single window whose excess over the reference,
``x_t - mean_{t-1} - delta``, exceeds ``max(jump, jump_sigmas · sd_{t-1})`` (``sd``: the standard
deviation of the windows seen) is a drift at once. Page-Hinkley alone needs about
``threshold / excess`` windows; the rule makes a clear jump cost one window, while on a stationary
stream a 6-sd excursion essentially never happens (Gaussian tail ≈ 1e-9 per window).

Why the rule matters: when a node's RTT doubles, a model that still predicts the old RTT has a
relative error ``|p - 2p| / 2p = 0.5`` per task, so the window's MAPE jumps from its healthy ~0.05–0.1
to ~0.5 — a shift of ~0.4, one window above ``jump``. A slow creep (0.10 → 0.20) stays below it and is
left to the cumulative sum.

Defaults, for an input that is a relative error (MAPE ≈ 0.05–0.3 when the model is healthy):

* ``delta = 0.02``: an increase of less than 2 percentage points of MAPE is tolerated forever;
  it is also the downward drift of ``m_t`` that keeps a stationary stream's statistic near zero.
* ``threshold = 0.5``: the excess error that must accumulate. A doubling of a 10 % MAPE adds
  ``0.10 - delta = 0.08`` per window, so it is detected after about 6–8 windows; a stationary stream
  with per-window noise σ = 0.03 crosses it with probability about ``exp(-2·delta·threshold/σ²)``.
* ``alpha = 1 - 1e-4``: slow forgetting, as in river, so ancient history cannot mask a change.
* ``min_instances = 12``: one minute of windows before any alarm (the mean needs a reference).
* ``jump = 0.25``, ``jump_sigmas = 6``: the level-shift rule (``jump=None`` turns it off).

After an alarm, :attr:`cumulative` and :attr:`threshold` are those of the rule that fired
(:attr:`rule`): for a level shift, the window's excess and its limit, so ``cumulative > threshold``
holds for every alarm.

>>> ph = PageHinkley()
>>> for t in range(40):
...     _ = ph.update(0.10 if t < 30 else 0.20, ts=1000.0 + 5 * t)
...     if ph.drift_detected:
...         break
>>> (t, ph.rule, round(ph.cumulative, 3), ph.onset_ts)
(37, 'page_hinkley', 0.539, 1145.0)
>>> ph = PageHinkley()
>>> for t in range(40):
...     _ = ph.update(0.10 if t < 30 else 0.50, ts=1000.0 + 5 * t)
...     if ph.drift_detected:
...         break
>>> (t, ph.rule, round(ph.cumulative, 3), ph.threshold, ph.onset_ts)
(30, 'level_shift', 0.38, 0.25, 1145.0)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Self

DELTA = 0.02
THRESHOLD = 0.5
ALPHA = 1.0 - 1e-4
MIN_INSTANCES = 12
JUMP = 0.25
JUMP_SIGMAS = 6.0


class PageHinkley:
    """One-sided Page-Hinkley detector of an increase in the mean of a stream, plus a level-shift rule.

    Parameters
    ----------
    delta
        Magnitude of change that is tolerated (same units as the input), ``>= 0``.
    threshold
        Value of the statistic that signals a drift (lambda), ``> 0``.
    alpha
        Forgetting factor of the cumulative sum, in ``(0, 1]``.
    min_instances
        Observations before a drift may be signalled, ``>= 1``.
    jump
        Smallest one-window excess over the reference that is a drift at once, ``> 0``; None: no
        level-shift rule (Page-Hinkley only).
    jump_sigmas
        The excess must also exceed this many standard deviations of the windows seen, ``>= 0``.

    Examples
    --------
    >>> import random
    >>> rng = random.Random(42)
    >>> ph = PageHinkley()
    >>> alarms = 0
    >>> for _ in range(500):
    ...     alarms += ph.update(rng.gauss(0.10, 0.03)).drift_detected
    >>> alarms
    0
    >>> PageHinkley(threshold=0)
    Traceback (most recent call last):
    ...
    ValueError: threshold must be > 0 (got 0)
    """

    def __init__(self, delta: float = DELTA, threshold: float = THRESHOLD, alpha: float = ALPHA,
                 min_instances: int = MIN_INSTANCES, jump: float | None = JUMP,
                 jump_sigmas: float = JUMP_SIGMAS) -> None:
        if not (math.isfinite(delta) and delta >= 0):
            raise ValueError(f"delta must be >= 0 (got {delta})")
        if not (math.isfinite(threshold) and threshold > 0):
            raise ValueError(f"threshold must be > 0 (got {threshold})")
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1] (got {alpha})")
        if min_instances < 1:
            raise ValueError(f"min_instances must be >= 1 (got {min_instances})")
        if jump is not None and not (math.isfinite(jump) and jump > 0):
            raise ValueError(f"jump must be > 0 or None (got {jump})")
        if not (math.isfinite(jump_sigmas) and jump_sigmas >= 0):
            raise ValueError(f"jump_sigmas must be >= 0 (got {jump_sigmas})")
        self.delta = float(delta)
        self._threshold = float(threshold)
        self.alpha = float(alpha)
        self.min_instances = int(min_instances)
        self.jump = float(jump) if jump is not None else None
        self.jump_sigmas = float(jump_sigmas)
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._mean = 0.0
        self._m2 = 0.0  # sum of squared deviations from the running mean (Welford)
        self._sum = 0.0
        self._min = math.inf
        self._onset: float | None = None
        self._drift = False
        self._rule: str | None = None
        self._shift = (0.0, 0.0)  # (excess, limit) of the level shift that fired

    @property
    def drift_detected(self) -> bool:
        return self._drift

    @property
    def rule(self) -> str | None:
        """``"page_hinkley"`` or ``"level_shift"`` right after an alarm, else None."""
        return self._rule

    @property
    def cumulative(self) -> float:
        """``m_t - M_t`` (0 before data); after a level-shift alarm, that window's excess."""
        if self._rule == "level_shift":
            return self._shift[0]
        return self._sum - self._min if self._n else 0.0

    @property
    def threshold(self) -> float:
        """lambda; after a level-shift alarm, the excess that window had to pass."""
        return self._shift[1] if self._rule == "level_shift" else self._threshold

    @property
    def onset_ts(self) -> float | None:
        return self._onset

    @property
    def n(self) -> int:
        return self._n

    def to_dict(self) -> dict[str, Any]:
        """The detector's running state, JSON-ready (the parameters are not included)."""
        return {"n": self._n, "mean": self._mean, "m2": self._m2, "sum": self._sum,
                "min": self._min if math.isfinite(self._min) else None, "onset": self._onset,
                "drift": self._drift, "rule": self._rule, "shift": list(self._shift)}

    def load(self, state: Mapping[str, Any]) -> Self:
        """Restore what :meth:`to_dict` wrote (the parameters stay this detector's own).

        >>> a = PageHinkley()
        >>> for x in (0.1, 0.12, 0.09, 0.3):
        ...     _ = a.update(x, ts=1.0)
        >>> b = PageHinkley().load(a.to_dict())
        >>> a.update(0.31).cumulative == b.update(0.31).cumulative and b.n == 5
        True
        """
        self._n = int(state.get("n", 0))
        self._mean = float(state.get("mean", 0.0))
        self._m2 = float(state.get("m2", 0.0))
        self._sum = float(state.get("sum", 0.0))
        low = state.get("min")
        self._min = math.inf if low is None else float(low)
        onset = state.get("onset")
        self._onset = None if onset is None else float(onset)
        self._drift = bool(state.get("drift", False))
        self._rule = state.get("rule")
        shift = state.get("shift") or (0.0, 0.0)
        self._shift = (float(shift[0]), float(shift[1]))
        return self

    def _level_shift(self, x: float) -> bool:
        if self.jump is None or self._n < self.min_instances:
            return False
        sd = math.sqrt(self._m2 / (self._n - 1)) if self._n > 1 else 0.0
        excess, limit = x - self._mean - self.delta, max(self.jump, self.jump_sigmas * sd)
        if excess > limit:
            self._shift = (excess, limit)
            return True
        return False

    def update(self, x: float, ts: float | None = None) -> Self:
        """Feed one observation; a non-finite value is ignored. After a drift, starts a fresh run."""
        if not math.isfinite(x):
            return self
        if self._drift:
            self._reset()
        shift = self._level_shift(x)  # against the reference before this window
        self._n += 1
        d = x - self._mean
        self._mean += d / self._n
        self._m2 += d * (x - self._mean)
        self._sum = self.alpha * self._sum + (x - self._mean - self.delta)
        if self._sum <= self._min:
            self._min = self._sum
            self._onset = float(ts) if ts is not None else float(self._n - 1)
        ph = self._n >= self.min_instances and self._sum - self._min > self._threshold
        self._drift = ph or shift
        self._rule = "page_hinkley" if ph else "level_shift" if shift else None
        return self
