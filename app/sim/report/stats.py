"""Mean and 95 % confidence interval over seeds, per policy and figure.

The interval is Student's t: ``mean +/- t(0.975, n-1) * s / sqrt(n)``; one seed gives a zero-width
interval, NaN values are left out.

>>> mean_ci([1.0, 2.0, 3.0, 4.0, 5.0])
(3.0, 1.963)
>>> aggregate({"a": [{"x": 1.0}, {"x": 3.0}]})["a"]["x"]["mean"]
2.0
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats as sps


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """(mean, half-width of the ``level`` confidence interval), rounded to 3 decimals in the half-width."""
    v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if v.size == 0:
        return float("nan"), float("nan")
    if v.size == 1:
        return float(v[0]), 0.0
    t = float(sps.t.ppf(0.5 + level / 2.0, v.size - 1))
    return float(v.mean()), round(t * float(v.std(ddof=1)) / math.sqrt(v.size), 3)


def aggregate(per_policy: Mapping[str, Sequence[Mapping[str, float]]]) -> dict[str, dict[str, dict[str, float]]]:
    """``{policy: {figure: {"mean", "ci95", "n"}}}`` from each policy's per-seed summaries."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for policy, runs in per_policy.items():
        keys = sorted({k for r in runs for k in r})
        out[policy] = {}
        for k in keys:
            vals = [r[k] for r in runs if k in r]
            m, ci = mean_ci(vals)
            out[policy][k] = {"mean": m, "ci95": ci, "n": float(len(vals))}
    return out


def ratio(a: float, b: float) -> float:
    """Relative change of ``a`` against ``b`` (``a / b - 1``); NaN when ``b`` is 0 or not finite."""
    if not (math.isfinite(a) and math.isfinite(b)) or b == 0:
        return float("nan")
    return a / b - 1.0
