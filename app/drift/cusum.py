"""Tabular CUSUM for an increase of the per-window prediction error against a warm-up reference.

The first ``min_instances`` observations set the in-control reference ``mu0`` (their mean). Then:

``S_t = max(0, S_{t-1} + x_t - mu0 - k)``  (:attr:`Cusum.cumulative`)

and a drift is signalled when ``S_t > threshold``. Unlike :class:`~app.drift.pagehinkley.PageHinkley`
the reference does not follow the stream, so a slow creep is caught as well as a jump; the cost is that
a reference learnt on a bad warm-up stays bad until the next reset.

Defaults match Page-Hinkley's for a relative-error input: ``k = 0.02`` (tolerated increase),
``threshold = 0.5`` (excess to accumulate), ``min_instances = 24`` (two minutes of 5 s windows: a
reference from fewer windows is noisy enough to eat the allowance ``k``).
The onset estimate is the time of the last window at which ``S`` was zero.

>>> c = Cusum()
>>> for t in range(40):
...     _ = c.update(0.10 if t < 30 else 0.20, ts=float(t))
...     if c.drift_detected:
...         break
>>> (t, round(c.cumulative, 2), c.onset_ts)
(36, 0.56, 29.0)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Self

K = 0.02
THRESHOLD = 0.5
MIN_INSTANCES = 24


class Cusum:
    """One-sided (upper) CUSUM with a reference mean learnt over a warm-up.

    Parameters
    ----------
    k
        Allowance: increase over the reference that is tolerated, ``>= 0``.
    threshold
        Value of ``S`` that signals a drift (h), ``> 0``.
    min_instances
        Warm-up observations that set the reference, ``>= 1``.

    Examples
    --------
    >>> import random
    >>> rng = random.Random(42)
    >>> c = Cusum()
    >>> sum(c.update(rng.gauss(0.10, 0.03)).drift_detected for _ in range(500))
    0
    >>> Cusum(k=-1)
    Traceback (most recent call last):
    ...
    ValueError: k must be >= 0 (got -1)
    """

    def __init__(self, k: float = K, threshold: float = THRESHOLD, min_instances: int = MIN_INSTANCES) -> None:
        if not (math.isfinite(k) and k >= 0):
            raise ValueError(f"k must be >= 0 (got {k})")
        if not (math.isfinite(threshold) and threshold > 0):
            raise ValueError(f"threshold must be > 0 (got {threshold})")
        if min_instances < 1:
            raise ValueError(f"min_instances must be >= 1 (got {min_instances})")
        self.k = float(k)
        self._threshold = float(threshold)
        self.min_instances = int(min_instances)
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._ref_sum = 0.0
        self._s = 0.0
        self._onset: float | None = None
        self._drift = False

    @property
    def drift_detected(self) -> bool:
        return self._drift

    @property
    def cumulative(self) -> float:
        return self._s

    @property
    def threshold(self) -> float:
        return self._threshold

    @property
    def onset_ts(self) -> float | None:
        return self._onset

    @property
    def n(self) -> int:
        return self._n

    @property
    def reference(self) -> float | None:
        """The in-control mean, once the warm-up is over."""
        return self._ref_sum / self.min_instances if self._n >= self.min_instances else None

    def to_dict(self) -> dict[str, Any]:
        return {"n": self._n, "ref_sum": self._ref_sum, "s": self._s, "onset": self._onset, "drift": self._drift}

    def load(self, state: Mapping[str, Any]) -> Self:
        """Restore what :meth:`to_dict` wrote.

        >>> a = Cusum(min_instances=2)
        >>> for x in (0.1, 0.1, 0.3):
        ...     _ = a.update(x)
        >>> b = Cusum(min_instances=2).load(a.to_dict())
        >>> a.update(0.4).cumulative == b.update(0.4).cumulative
        True
        """
        onset = state.get("onset")
        self._n = int(state.get("n", 0))
        self._ref_sum = float(state.get("ref_sum", 0.0))
        self._s = float(state.get("s", 0.0))
        self._onset = None if onset is None else float(onset)
        self._drift = bool(state.get("drift", False))
        return self

    def update(self, x: float, ts: float | None = None) -> Self:
        """Feed one observation; a non-finite value is ignored. After a drift, starts a fresh run."""
        if not math.isfinite(x):
            return self
        if self._drift:
            self._reset()
        self._n += 1
        at = float(ts) if ts is not None else float(self._n - 1)
        if self._n <= self.min_instances:
            self._ref_sum += x
            self._onset = at
            return self
        mu0 = self._ref_sum / self.min_instances
        self._s = max(0.0, self._s + x - mu0 - self.k)
        if self._s == 0.0:
            self._onset = at
        self._drift = self._s > self._threshold
        return self
