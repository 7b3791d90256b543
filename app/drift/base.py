"""The drift-detector seam: what the stream processor feeds per node × app, and what it reads back.

A detector receives one number per error period (5 s): the relative error of that window for one
node × app (MAPE, or RMSE divided by the mean observed RTT). It keeps a cumulative statistic and
raises ``drift_detected`` when the statistic passes ``threshold``. ``onset_ts`` estimates when the
change began: the time (or, without times, the index) at which the statistic last stood at its
minimum, i.e. the last moment the error still looked like its reference level.

After a detection the next :meth:`DriftDetector.update` starts a fresh run (river's convention), so a
caller that reacts once per ``drift_detected`` never sees the same drift twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, Self, runtime_checkable


@runtime_checkable
class DriftDetector(Protocol):
    """A one-sided detector of an increase in a stream of per-window errors."""

    @property
    def drift_detected(self) -> bool:
        """True right after the update that pushed the statistic past the threshold."""
        ...

    @property
    def cumulative(self) -> float:
        """The test statistic (same units as the threshold); retrain-events carry it as cumulative_error."""
        ...

    @property
    def threshold(self) -> float:
        """The value the statistic must exceed for a drift."""
        ...

    @property
    def onset_ts(self) -> float | None:
        """Estimated start of the change: time (or index) of the statistic's last minimum; None before data."""
        ...

    @property
    def n(self) -> int:
        """Observations since the last reset."""
        ...

    def update(self, x: float, ts: float | None = None) -> Self:
        """Feed one window's error (``ts``: its time in unix seconds; the index is used when None)."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """The running state, JSON-ready (a restarted worker keeps its reference)."""
        ...

    def load(self, state: Mapping[str, Any]) -> Self:
        """Restore what :meth:`to_dict` wrote; the parameters stay the detector's own."""
        ...
