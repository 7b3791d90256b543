"""Page-Hinkley test for an increase of the per-window prediction error (river's formulation, one-sided).

For each observation ``x_t`` (the relative error of one 5 s window of one node × app):

``mean_t = mean(x_1..x_t)``
``m_t = alpha * m_{t-1} + (x_t - mean_t - delta)``
``M_t = min(m_1..m_t)``
``PH_t = m_t - M_t``  (:attr:`PageHinkley.cumulative`)

A drift is signalled when ``PH_t > threshold`` and at least ``min_instances`` windows were seen.

Defaults, for an input that is a relative error (MAPE ≈ 0.05–0.3 when the model is healthy):

* ``delta = 0.02``: an increase of less than 2 percentage points of MAPE is tolerated forever;
  it is also the downward drift of ``m_t`` that keeps a stationary stream's statistic near zero.
* ``threshold = 0.5``: the excess error that must accumulate. A doubling of a 10 % MAPE adds
  ``0.10 - delta = 0.08`` per window, so it is detected after about 8 windows (≈ 40 s at 5 s; the
  running mean rises too); a stationary stream with per-window noise σ = 0.03 crosses it with
  probability about ``exp(-2·delta·threshold/σ²) ≈ 2e-5`` per excursion.
* ``alpha = 1 - 1e-4``: slow forgetting, as in river, so ancient history cannot mask a change.
* ``min_instances = 12``: one minute of windows before any alarm (the mean needs a reference).

>>> ph = PageHinkley()
>>> for t in range(40):
...     _ = ph.update(0.10 if t < 30 else 0.20, ts=1000.0 + 5 * t)
...     if ph.drift_detected:
...         break
>>> (t, round(ph.cumulative, 3), ph.onset_ts)
(37, 0.539, 1145.0)
"""

from __future__ import annotations

import math
from typing import Self

DELTA = 0.02
THRESHOLD = 0.5
ALPHA = 1.0 - 1e-4
MIN_INSTANCES = 12


class PageHinkley:
    """One-sided Page-Hinkley detector of an increase in the mean of a stream.

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
                 min_instances: int = MIN_INSTANCES) -> None:
        if not (math.isfinite(delta) and delta >= 0):
            raise ValueError(f"delta must be >= 0 (got {delta})")
        if not (math.isfinite(threshold) and threshold > 0):
            raise ValueError(f"threshold must be > 0 (got {threshold})")
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1] (got {alpha})")
        if min_instances < 1:
            raise ValueError(f"min_instances must be >= 1 (got {min_instances})")
        self.delta = float(delta)
        self._threshold = float(threshold)
        self.alpha = float(alpha)
        self.min_instances = int(min_instances)
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._mean = 0.0
        self._sum = 0.0
        self._min = math.inf
        self._onset: float | None = None
        self._drift = False

    @property
    def drift_detected(self) -> bool:
        return self._drift

    @property
    def cumulative(self) -> float:
        """``m_t - M_t``: how far the cumulative deviation stands above its minimum (0 before data)."""
        return self._sum - self._min if self._n else 0.0

    @property
    def threshold(self) -> float:
        return self._threshold

    @property
    def onset_ts(self) -> float | None:
        return self._onset

    @property
    def n(self) -> int:
        return self._n

    def update(self, x: float, ts: float | None = None) -> Self:
        """Feed one observation; a non-finite value is ignored. After a drift, starts a fresh run."""
        if not math.isfinite(x):
            return self
        if self._drift:
            self._reset()
        self._n += 1
        self._mean += (x - self._mean) / self._n
        self._sum = self.alpha * self._sum + (x - self._mean - self.delta)
        if self._sum <= self._min:
            self._min = self._sum
            self._onset = float(ts) if ts is not None else float(self._n - 1)
        self._drift = self._n >= self.min_instances and self._sum - self._min > self._threshold
        return self
