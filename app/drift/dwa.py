"""Dynamic window adjustment (DWA): tune a node × app feature window from how its RMSE moves.

The rule, evaluated once per error period (5 s) with the RMSE of the last and the previous evaluation:

``change = (current - previous) / previous``

* ``change >= rise`` (RMSE rose by 15 % or more): the window grows, ``min(window * grow, max_s)``;
* ``change <= -fall`` (RMSE fell by 10 % or more): the window shrinks, ``max(window * shrink, min_s)``;
* otherwise, or when ``previous <= 0`` or either RMSE is not finite, the window stays as it is.

Defaults are the seed's: ×1.5 / ×0.8, a rise of 15 % or more / a fall of 10 % or more, bounded to 5–60 s.
The comparisons allow :data:`TOLERANCE` (relative) of floating-point rounding, so an RMSE computed to be
exactly 15 % up (``115.0`` after ``100.0``, or ``0.345`` after ``0.3``) counts as a rise of 15 %.

>>> adjust_window(120.0, 100.0, 10.0)
15.0
>>> adjust_window(115.0, 100.0, 10.0), adjust_window(0.345, 0.3, 10.0)
(15.0, 15.0)
>>> adjust_window(90.0, 100.0, 10.0)
8.0
>>> adjust_window(114.9, 100.0, 10.0), adjust_window(90.1, 100.0, 10.0)
(10.0, 10.0)
>>> adjust_window(105.0, 100.0, 10.0)
10.0
>>> adjust_window(100.0, 0.0, 10.0)
10.0
"""

from __future__ import annotations

import math

MIN_WINDOW_S = 5.0
MAX_WINDOW_S = 60.0
GROW = 1.5
SHRINK = 0.8
RISE = 0.15
FALL = 0.10
TOLERANCE = 1e-9  # relative slack on the thresholds: rounding must not move an exact 15 % rise out of the rule


def adjust_window(current_rmse: float, prev_rmse: float, window_s: float, *, min_s: float = MIN_WINDOW_S,
                  max_s: float = MAX_WINDOW_S, grow: float = GROW, shrink: float = SHRINK, rise: float = RISE,
                  fall: float = FALL) -> float:
    """The next window length (seconds) after one evaluation.

    Parameters
    ----------
    current_rmse, prev_rmse
        RMSE (ms) of this evaluation and of the previous one.
    window_s
        The window in force now.
    min_s, max_s
        Bounds of the result (a grow never passes ``max_s``, a shrink never passes ``min_s``).
    grow, shrink
        Factors applied on a rise / a fall.
    rise, fall
        Relative RMSE change that triggers a grow (``>= rise``) or a shrink (``<= -fall``).

    Returns
    -------
    float
        The new window; unchanged when the change is inside the dead band or cannot be computed.
    """
    if not (math.isfinite(current_rmse) and math.isfinite(prev_rmse)) or prev_rmse <= 0:
        return window_s
    change = (current_rmse - prev_rmse) / prev_rmse
    if change >= rise - TOLERANCE * max(rise, 1.0):
        return min(window_s * grow, max_s)
    if change <= -fall + TOLERANCE * max(fall, 1.0):
        return max(window_s * shrink, min_s)
    return window_s


class DynamicWindow:
    """Stateful DWA for one node × app: feed it each period's RMSE, read ``window_s``.

    Parameters
    ----------
    min_s, max_s
        Bounds of the window (seconds), ``0 < min_s <= max_s``.
    initial_s
        The window before any evaluation; clamped into ``[min_s, max_s]``.
    grow, shrink, rise, fall
        As in :func:`adjust_window`.

    Examples
    --------
    >>> import random
    >>> rng = random.Random(7)
    >>> dw = DynamicWindow(min_s=5.0, max_s=60.0, initial_s=30.0)
    >>> for rmse in [100.0, 130.0, 150.0, 120.0, 100.0, 80.0]:
    ...     _ = dw.update(rmse)
    >>> round(dw.window_s, 2)
    30.72
    >>> for _ in range(200):
    ...     _ = dw.update(rng.uniform(50.0, 200.0))
    >>> 5.0 <= dw.window_s <= 60.0
    True
    >>> DynamicWindow(min_s=10.0, max_s=5.0)
    Traceback (most recent call last):
    ...
    ValueError: min_s must be <= max_s (got 10.0 > 5.0)
    """

    def __init__(self, min_s: float = MIN_WINDOW_S, max_s: float = MAX_WINDOW_S, initial_s: float = 30.0, *,
                 grow: float = GROW, shrink: float = SHRINK, rise: float = RISE, fall: float = FALL) -> None:
        if not (math.isfinite(min_s) and min_s > 0):
            raise ValueError(f"min_s must be a finite number > 0 (got {min_s})")
        if not (math.isfinite(max_s) and max_s >= min_s):
            raise ValueError(f"min_s must be <= max_s (got {min_s} > {max_s})")
        if not math.isfinite(initial_s) or initial_s <= 0:
            raise ValueError(f"initial_s must be a finite number > 0 (got {initial_s})")
        if not grow >= 1.0:
            raise ValueError(f"grow must be >= 1 (got {grow})")
        if not 0.0 < shrink <= 1.0:
            raise ValueError(f"shrink must be in (0, 1] (got {shrink})")
        if not (rise >= 0.0 and fall >= 0.0):
            raise ValueError(f"rise and fall must be >= 0 (got {rise}, {fall})")
        self.min_s = float(min_s)
        self.max_s = float(max_s)
        self.initial_s = float(initial_s)
        self.grow = grow
        self.shrink = shrink
        self.rise = rise
        self.fall = fall
        self._reset()

    def _reset(self) -> None:
        self._window_s = min(max(self.initial_s, self.min_s), self.max_s)
        self._prev_rmse = math.nan

    @property
    def window_s(self) -> float:
        """The window (seconds) in force after the last update."""
        return self._window_s

    @property
    def last_rmse(self) -> float:
        """The RMSE of the last usable evaluation (NaN before the first)."""
        return self._prev_rmse

    def update(self, rmse: float) -> DynamicWindow:
        """Apply one evaluation's RMSE; a non-finite or negative RMSE is ignored."""
        if not math.isfinite(rmse) or rmse < 0:
            return self
        if math.isfinite(self._prev_rmse):
            self._window_s = adjust_window(rmse, self._prev_rmse, self._window_s, min_s=self.min_s,
                                           max_s=self.max_s, grow=self.grow, shrink=self.shrink,
                                           rise=self.rise, fall=self.fall)
        self._prev_rmse = rmse
        return self
