"""Champion/challenger: promote a freshly trained model only when it beats the one in service.

Both models are scored on the same holdout rows, which the challenger never trained on: the most
recent ``holdout_fraction`` of the key's history, or, after a drift, every other row since its onset
plus the newest rows before it (:func:`app.trainer.pipeline.split`). The challenger wins when

``rmse(challenger) < (1 - margin) · rmse(champion)``

with ``margin = 0.02`` by default: a challenger must be at least 2 % better, so noise between two
equally good models never churns versions through the cluster (every promotion is a new blob, a
model-updates message and a reload in every extender). RMSE is the deciding figure because it is
what the system minimises and reports (DWA and the seed's evaluation are in RMSE).

A challenger whose RMSE is not a finite number is rejected. With no champion, or a champion that
cannot be scored (its blob cannot be loaded, or its predictions are not finite), the challenger is
promoted: any working model is better than none.

>>> judge({"rmse_ms": 90.0}, {"rmse_ms": 100.0}).promote
True
>>> judge({"rmse_ms": 99.0}, {"rmse_ms": 100.0})
Verdict(promote=False, reason='not_better', challenger_rmse_ms=99.0, champion_rmse_ms=100.0)
>>> judge({"rmse_ms": 50.0}, None).reason
'no_champion'
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

MARGIN = 0.02
METRIC = "rmse_ms"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The decision and why: ``reason`` is one of ``better``, ``not_better``, ``no_champion``,
    ``champion_unusable``, ``challenger_unusable`` (stable: it is logged and can be a label)."""

    promote: bool
    reason: str
    challenger_rmse_ms: float
    champion_rmse_ms: float | None


def _figure(metrics: Mapping[str, float] | None) -> float | None:
    if metrics is None:
        return None
    value = metrics.get(METRIC)
    return float(value) if value is not None else math.nan


def judge(challenger: Mapping[str, float], champion: Mapping[str, float] | None, *,
          margin: float = MARGIN) -> Verdict:
    """Decide whether ``challenger`` replaces ``champion`` (holdout metrics of each, same rows).

    Parameters
    ----------
    challenger, champion
        Metrics with ``rmse_ms`` on the shared holdout; ``champion`` None when there is none.
    margin
        Relative improvement required, in ``[0, 1)``.
    """
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin must be in [0, 1) (got {margin})")
    new = _figure(challenger)
    assert new is not None
    old = _figure(champion)
    if not math.isfinite(new) or new < 0:
        return Verdict(False, "challenger_unusable", new, old)
    if old is None:
        return Verdict(True, "no_champion", new, None)
    if not math.isfinite(old):
        return Verdict(True, "champion_unusable", new, old)
    if new < (1.0 - margin) * old:
        return Verdict(True, "better", new, old)
    return Verdict(False, "not_better", new, old)
