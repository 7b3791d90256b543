"""Association between a candidate feature and RTT: Pearson, Spearman, Kendall tau, distance correlation, MIC.

Every measure has a *signed* value (Pearson, Spearman and Kendall keep their sign; distance correlation and
MIC are unsigned) and a *strength* in [0, 1] (``|signed|``), so the five are comparable in a vote.

Input policy, the same for every measure:

* rows where ``x`` or ``y`` is NaN are dropped pairwise (NaN is "missing", as XGBoost reads it);
* ``+inf``/``-inf`` raise :class:`MeasureError` (a reading that overflowed is a bug upstream, not data);
* a pair with fewer than :data:`MIN_SAMPLES` rows left, or with a constant ``x`` or ``y``, is *degenerate*:
  every measure gives 0.0 (never NaN) and :func:`measure_table` lists the column.

Values are divided by their largest magnitude before measuring (all five are scale invariant), so extreme
but finite inputs (1e300) neither overflow nor lose the result.

>>> import numpy as np
>>> x = np.arange(8.0)
>>> round(pearson(x, -2 * x), 6), round(spearman(x, x ** 3), 6), round(kendall(x, -x), 6)
(-1.0, 1.0, -1.0)
>>> distance_correlation(x, np.ones(8)), strength("pearson", x, [np.nan] * 8)
(0.0, 0.0)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt
from scipy.stats import kendalltau, rankdata

from app.cpus import usable_cpus
from app.errors import RttError
from app.features import dcor_fast as _dcor_fast
from app.features import mic as _mic

MEASURES: tuple[str, ...] = ("pearson", "spearman", "kendall", "dcor", "mic")
SIGNED = frozenset({"pearson", "spearman", "kendall"})
MIN_SAMPLES = 4
MIC_THREADS = min(4, usable_cpus())  # threads for the columns' MIC in measure_table (quota included)

ArrayLike = npt.ArrayLike


class MeasureError(RttError, ValueError):
    """Input a measure cannot use: lengths differ, a value is infinite, or the measure is unknown."""


def clean_pair(x: ArrayLike, y: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Float64 copies of ``x`` and ``y`` without the rows where either is NaN, each scaled to [-1, 1].

    >>> clean_pair([1.0, float("nan"), 4.0], [2.0, 3.0, float("nan")])
    (array([1.]), array([1.]))
    """
    xa = np.asarray(x, dtype=np.float64).ravel()
    ya = np.asarray(y, dtype=np.float64).ravel()
    if xa.shape != ya.shape:
        raise MeasureError(f"x and y must have the same length (got {xa.size} and {ya.size})")
    if np.isinf(xa).any() or np.isinf(ya).any():
        raise MeasureError("infinite value in input (NaN is dropped as missing, inf is rejected)")
    keep = ~(np.isnan(xa) | np.isnan(ya))
    if not keep.all():
        xa, ya = xa[keep], ya[keep]
    return _scaled(xa), _scaled(ya)


def _scaled(a: np.ndarray) -> np.ndarray:
    top = float(np.max(np.abs(a))) if a.size else 0.0
    return a / top if top > 0.0 else a.copy()


def is_degenerate(x: np.ndarray, y: np.ndarray) -> bool:
    """True when a cleaned pair has too few rows or a constant side.

    >>> is_degenerate(np.arange(3.0), np.arange(3.0)), is_degenerate(np.arange(4.0), np.arange(4.0))
    (True, False)
    """
    return bool(x.size < MIN_SAMPLES or np.ptp(x) == 0.0 or np.ptp(y) == 0.0)


def _finite(v: float, low: float) -> float:
    v = float(v)
    return 0.0 if not np.isfinite(v) else min(max(v, low), 1.0)


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    xc = x - x.mean()
    yc = y - y.mean()
    den = float(np.sqrt(np.dot(xc, xc) * np.dot(yc, yc)))
    return float(np.dot(xc, yc)) / den if den > 0.0 else 0.0


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    return _pearson(rankdata(x), rankdata(y))


def _kendall(x: np.ndarray, y: np.ndarray) -> float:
    return float(kendalltau(x, y).statistic)


def _dcor(x: np.ndarray, y: np.ndarray) -> float:
    return _dcor_fast.distance_correlation(x, y)


def _mic_value(x: np.ndarray, y: np.ndarray) -> float:
    return _mic.mic(x, y)


_KERNELS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "pearson": _pearson, "spearman": _spearman, "kendall": _kendall, "dcor": _dcor, "mic": _mic_value,
}


def association(measure: str, x: ArrayLike, y: ArrayLike) -> float:
    """The signed value of ``measure`` (in [-1, 1] for signed measures, [0, 1] otherwise); 0.0 if degenerate."""
    kernel = _KERNELS.get(measure)
    if kernel is None:
        raise MeasureError(f"unknown measure {measure!r} (known: {', '.join(MEASURES)})")
    xa, ya = clean_pair(x, y)
    if is_degenerate(xa, ya):
        return 0.0
    return _finite(kernel(xa, ya), -1.0 if measure in SIGNED else 0.0)


def strength(measure: str, x: ArrayLike, y: ArrayLike) -> float:
    """``|association|`` in [0, 1]: how strongly ``measure`` relates ``x`` and ``y``."""
    return abs(association(measure, x, y))


def pearson(x: ArrayLike, y: ArrayLike) -> float:
    """Pearson's r in [-1, 1] (linear association)."""
    return association("pearson", x, y)


def spearman(x: ArrayLike, y: ArrayLike) -> float:
    """Spearman's rho in [-1, 1] (monotone association; Pearson of average ranks)."""
    return association("spearman", x, y)


def kendall(x: ArrayLike, y: ArrayLike) -> float:
    """Kendall's tau-b in [-1, 1] (concordant minus discordant pairs, ties corrected)."""
    return association("kendall", x, y)


def distance_correlation(x: ArrayLike, y: ArrayLike) -> float:
    """Distance correlation in [0, 1] (zero only under independence); see :mod:`app.features.dcor_fast`."""
    return association("dcor", x, y)


def mic(x: ArrayLike, y: ArrayLike) -> float:
    """Maximal information coefficient in [0, 1] (see :mod:`app.features.mic`)."""
    return association("mic", x, y)


@dataclasses.dataclass(frozen=True)
class MeasureTable:
    """Every measure for every feature column against one target.

    ``signed[i, j]`` / ``strength[i, j]`` belong to ``names[i]`` and ``measures[j]``; ``n_used[i]`` is the
    number of rows left after dropping NaN; ``degenerate`` names the columns that scored 0.0 by definition.
    ``seconds`` holds the time spent in each measure.
    """

    names: tuple[str, ...]
    measures: tuple[str, ...]
    signed: np.ndarray
    strength: np.ndarray
    n_used: np.ndarray
    degenerate: tuple[str, ...]
    seconds: dict[str, float]


def measure_table(X: ArrayLike, y: ArrayLike, names: Sequence[str],
                  measures: Sequence[str] = MEASURES, threads: int = MIC_THREADS) -> MeasureTable:
    """All ``measures`` between each column of ``X`` (n_samples × n_features) and ``y``.

    MIC takes most of the time (its kernels release the GIL): with ``threads`` > 1 the columns' MIC values
    are computed on that many threads, the same values as one at a time. ``seconds`` adds up the time each
    measure took, whatever the thread.
    """
    xm = np.asarray(X, dtype=np.float64)
    if xm.ndim != 2 or xm.shape[1] != len(names):
        raise MeasureError(f"X must be 2-D with one column per name (got shape {xm.shape}, {len(names)} names)")
    unknown = [m for m in measures if m not in _KERNELS]
    if unknown:
        raise MeasureError(f"unknown measure(s) {unknown} (known: {', '.join(MEASURES)})")
    signed = np.zeros((len(names), len(measures)))
    n_used = np.zeros(len(names), dtype=np.int64)
    seconds = dict.fromkeys(measures, 0.0)
    degenerate: list[str] = []
    pairs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for i, name in enumerate(names):
        try:
            xa, ya = clean_pair(xm[:, i], y)
        except MeasureError as exc:
            raise MeasureError(f"{name}: {exc}") from None
        n_used[i] = xa.size
        if is_degenerate(xa, ya):
            degenerate.append(name)
        else:
            pairs[i] = (xa, ya)

    def one(i: int, j: int) -> float:
        started = time.perf_counter()
        measure = measures[j]
        signed[i, j] = _finite(_KERNELS[measure](*pairs[i]), -1.0 if measure in SIGNED else 0.0)
        return time.perf_counter() - started

    pooled = measures.index("mic") if "mic" in measures and threads > 1 and len(pairs) > 1 else -1
    if pooled >= 0:
        with ThreadPoolExecutor(min(threads, len(pairs)), thread_name_prefix="mic") as pool:
            seconds["mic"] += sum(pool.map(lambda i: one(i, pooled), pairs))
    for i in pairs:
        for j, measure in enumerate(measures):
            if j != pooled:
                seconds[measure] += one(i, j)
    return MeasureTable(tuple(names), tuple(measures), signed, np.abs(signed), n_used, tuple(degenerate), seconds)
