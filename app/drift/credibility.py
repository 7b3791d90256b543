"""Credibility of a node's predictions: how far the scheduler may trust them (0 = not at all, 1 = fully).

From each error period's MAPE of a node × app (``n`` predictions evaluated in it):

1. exponentially weighted MAPE over windows with half-life ``H`` windows:
   ``e ← e + β (mape - e)`` with ``β = 1 - 2^(-1/H)`` (the first window sets ``e = mape``);
   windows with ``n = 0`` are skipped;
2. accuracy ``a = clamp(1 - e, 0, 1)`` (a MAPE of 100 % or worse is accuracy 0);
3. weight blended with the prior by evidence: ``w = (n0 · prior + N · a) / (n0 + N)`` where ``N`` is the
   number of predictions evaluated so far and ``n0`` the prior's strength in predictions.

An unseen node has ``w = prior`` (``Settings.credibility_prior``, 0.5). ``w`` is in [0, 1] and, for a
fixed ``N``, never decreases when accuracy rises.

>>> credibility(0.9, 0)
0.5
>>> credibility(0.9, 20)
0.7
>>> c = Credibility(prior=0.5, half_life=4.0, n0=20.0)
>>> for mape in [0.10, 0.12, 0.08, 0.10]:
...     _ = c.update(mape, n=10)
>>> (round(c.accuracy, 4), round(c.weight, 4))
(0.9004, 0.767)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Self

PRIOR = 0.5
HALF_LIFE_WINDOWS = 12.0
PRIOR_STRENGTH = 20.0


def _clamp01(x: float) -> float:
    return 0.0 if not x > 0.0 else 1.0 if x > 1.0 else x


def credibility(accuracy: float, n: float, prior: float = PRIOR, n0: float = PRIOR_STRENGTH) -> float:
    """Blend ``accuracy`` (from ``n`` evaluated predictions) with ``prior`` (worth ``n0`` predictions).

    Inputs out of range are clamped (accuracy and prior to [0, 1], ``n`` to >= 0); NaN accuracy counts
    as 0, so the result is always a number in [0, 1].
    """
    a, p = _clamp01(accuracy), _clamp01(prior)
    if math.isinf(n) and n > 0:
        return a
    n = n if n > 0 else 0.0  # also NaN -> 0
    if n0 <= 0 and n == 0:
        return p
    return _clamp01((n0 * p + n * a) / (n0 + n))


class Credibility:
    """Credibility tracker for one node × app, fed once per error period.

    Parameters
    ----------
    prior
        Weight of a node never evaluated, in [0, 1].
    half_life
        Half-life of the MAPE average, in windows, ``> 0``.
    n0
        Strength of the prior in evaluated predictions, ``>= 0``.

    Examples
    --------
    >>> Credibility(prior=1.5)
    Traceback (most recent call last):
    ...
    ValueError: prior must be in [0, 1] (got 1.5)
    """

    def __init__(self, prior: float = PRIOR, half_life: float = HALF_LIFE_WINDOWS, n0: float = PRIOR_STRENGTH) -> None:
        if not 0.0 <= prior <= 1.0:
            raise ValueError(f"prior must be in [0, 1] (got {prior})")
        if not (math.isfinite(half_life) and half_life > 0):
            raise ValueError(f"half_life must be > 0 (got {half_life})")
        if not (math.isfinite(n0) and n0 >= 0):
            raise ValueError(f"n0 must be >= 0 (got {n0})")
        self.prior = float(prior)
        self.half_life = float(half_life)
        self.n0 = float(n0)
        self._beta = 1.0 - 2.0 ** (-1.0 / self.half_life)
        self._reset()

    def _reset(self) -> None:
        self._ewma_mape: float | None = None
        self._n = 0

    @property
    def n(self) -> int:
        """Predictions evaluated so far."""
        return self._n

    @property
    def ewma_mape(self) -> float | None:
        return self._ewma_mape

    @property
    def accuracy(self) -> float:
        """``clamp(1 - EWMA(MAPE), 0, 1)``; the prior before any evaluation."""
        return self.prior if self._ewma_mape is None else _clamp01(1.0 - self._ewma_mape)

    @property
    def weight(self) -> float:
        """The credibility in [0, 1]."""
        return credibility(self.accuracy, self._n, self.prior, self.n0)

    def update(self, mape: float, n: int) -> Self:
        """Feed one window: its MAPE (fraction) and how many predictions it evaluated."""
        if n <= 0 or not math.isfinite(mape) or mape < 0:
            return self
        if self._ewma_mape is None:
            self._ewma_mape = float(mape)
        else:
            self._ewma_mape += self._beta * (mape - self._ewma_mape)
        self._n += int(n)
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"ewma_mape": self._ewma_mape, "n": self._n}

    def load(self, state: Mapping[str, Any]) -> Self:
        """Restore the state written by :meth:`to_dict` (settings stay those of this object)."""
        ewma, n = state.get("ewma_mape"), int(state.get("n", 0))
        if n < 0 or (ewma is not None and not (math.isfinite(float(ewma)) and float(ewma) >= 0)):
            raise ValueError(f"bad credibility state {dict(state)!r}")
        self._ewma_mape = None if ewma is None else float(ewma)
        self._n = n
        return self
