"""A drift episode: after a detection, signal again while the error stays above its pre-drift reference.

A detector that restarts after each alarm (Page-Hinkley, CUSUM) takes the post-change error as its new
normal: if the retrained model does not fix the drift, the raised error is never signalled again.
:class:`DriftEpisode` keeps the *reference* (an EWMA of the per-period error while no episode is open,
half-life ``half_life`` periods). A detection opens an episode; during it, each period adds its excess
``x - reference - delta`` to a one-sided sum (floored at 0), and when the sum passes ``threshold`` the
drift is signalled again (and the sum restarts). ``calm`` periods in a row at most ``reference + delta``
close the episode.

>>> ep = DriftEpisode(delta=0.02, threshold=0.5)
>>> for x in [0.10] * 10:
...     _ = ep.update(x, detected=False)
>>> ep.update(0.50, detected=True).open, round(ep.reference, 2)
(True, 0.1)
>>> [ep.update(0.40, detected=False).resignal for _ in range(3)]
[False, True, False]
>>> [ep.update(0.11, detected=False).open for _ in range(3)]
[True, True, False]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Self


class DriftEpisode:
    """Re-signalling of a drift that persists.

    Parameters
    ----------
    delta
        Tolerated excess over the reference, ``>= 0`` (same units as the error).
    threshold
        Accumulated excess that signals the drift again, ``> 0``.
    calm
        Periods in a row within ``reference + delta`` that close an episode, ``>= 1``.
    half_life
        Half-life (periods) of the reference EWMA, ``> 0``.
    """

    def __init__(self, delta: float = 0.02, threshold: float = 0.5, calm: int = 3, half_life: float = 12.0) -> None:
        if not (math.isfinite(delta) and delta >= 0):
            raise ValueError(f"delta must be >= 0 (got {delta})")
        if not (math.isfinite(threshold) and threshold > 0):
            raise ValueError(f"threshold must be > 0 (got {threshold})")
        if calm < 1:
            raise ValueError(f"calm must be >= 1 (got {calm})")
        if not (math.isfinite(half_life) and half_life > 0):
            raise ValueError(f"half_life must be > 0 (got {half_life})")
        self.delta, self.threshold, self.calm = float(delta), float(threshold), int(calm)
        self._beta = 1.0 - 2.0 ** (-1.0 / half_life)
        self.reference: float | None = None
        self.open = False
        self.excess = 0.0
        self.resignal = False
        self.onset_ts: float | None = None
        self._calm = 0

    def to_dict(self) -> dict[str, Any]:
        """The episode's state, JSON-ready (the parameters are not included)."""
        return {"reference": self.reference, "open": self.open, "excess": self.excess,
                "resignal": self.resignal, "onset_ts": self.onset_ts, "calm": self._calm}

    def load(self, state: Mapping[str, Any]) -> Self:
        """Restore what :meth:`to_dict` wrote."""
        ref, onset = state.get("reference"), state.get("onset_ts")
        self.reference = None if ref is None else float(ref)
        self.open = bool(state.get("open", False))
        self.excess = float(state.get("excess", 0.0))
        self.resignal = bool(state.get("resignal", False))
        self.onset_ts = None if onset is None else float(onset)
        self._calm = int(state.get("calm", 0))
        return self

    def update(self, x: float, *, detected: bool, onset_ts: float | None = None) -> Self:
        """One period's error and whether the detector fired on it; ``resignal`` says to signal again.

        After a re-signal, ``excess`` holds the sum that passed the threshold until the next update.
        """
        if self.resignal:
            self.resignal, self.excess = False, 0.0
        if not math.isfinite(x):
            return self
        if detected and not self.open:
            self.open, self.excess, self._calm, self.onset_ts = True, 0.0, 0, onset_ts
            return self
        if not self.open:
            self.reference = x if self.reference is None else self.reference + self._beta * (x - self.reference)
            return self
        excess = x - (self.reference or 0.0) - self.delta
        if excess <= 0:
            self._calm += 1
            if self._calm >= self.calm:
                self.open, self.excess, self.onset_ts = False, 0.0, None
            return self
        self._calm = 0
        self.excess += excess
        if self.excess > self.threshold and not detected:
            self.resignal = True
        return self
