"""Distance correlation of two 1-D samples (Székely, Rizzo & Bakirov 2007): the biased V-statistic estimator.

With ``a_ij = |x_i - x_j|`` and ``b_ij = |y_i - y_j|`` double-centred into ``A`` and ``B``
(``A_ij = a_ij - mean_i(a) - mean_j(a) + mean(a)``), the squared distance covariance is
``dcov²(x, y) = mean(A * B)`` and the distance correlation is
``dcor(x, y) = sqrt(dcov²(x, y) / sqrt(dcov²(x, x) · dcov²(y, y)))``, in [0, 1]; 0 when either side is
constant. This is the value of ``dcor.distance_correlation`` (its default, biased estimator).

Two equivalent computations:

* ``"direct"``: the double-centred sums in O(n²) time and O(n) memory, never storing a matrix; the most
  accurate, used for small samples;
* ``"fast"``: O(n log n) (Huo & Székely 2016). Sorted by ``x``, ``Σ a_ij b_ij`` splits into sums over
  ``j < i`` with ``y_j < y_i`` of ``1, x_j, y_j, x_j y_j``, gathered with a Fenwick tree over the ranks of
  ``y``; the row sums ``Σ_j a_ij`` come from prefix sums of the sorted values.

Inputs are shifted by their median and divided by their largest magnitude first (distance correlation is
invariant to both), so nearly constant or huge finite values keep their precision. NaN is not accepted
here; callers drop missing rows (see :mod:`app.features.measures`). The numba kernels are compiled on
first use and cached on disk; :func:`warm_up` compiles them ahead of time.

>>> import numpy as np
>>> x = np.arange(8.0)
>>> distance_correlation(x, 3 * x - 2), distance_correlation(x, np.ones(8))
(1.0, 0.0)
>>> round(distance_correlation(x, (x - 3.5) ** 2), 6)
0.502718
>>> round(distance_correlation(x, (x - 3.5) ** 2, method="fast"), 6)
0.502718
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

DIRECT_MAX_N = 256  # "auto" uses the O(n²) sums up to this many samples, the O(n log n) ones above
METHODS = ("auto", "direct", "fast")


@njit(cache=True, error_model="numpy", nogil=True)
def _row_sums(v: np.ndarray, order: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """``Σ_j |v_i - v_j|`` for every ``i``, from the ascending ``order`` of ``v`` (ties need no care)."""
    n = v.size
    total = 0.0
    for i in range(n):
        total += v[i]
    out = np.empty(n)
    prefix = 0.0
    for k in range(n):
        i = order[k]
        prefix += v[i]
        out[i] = v[i] * (2 * (k + 1) - n) + total - 2.0 * prefix
    return out


@njit(cache=True, error_model="numpy", nogil=True)
def _direct(x: np.ndarray, y: np.ndarray, ax: np.ndarray,
            by: np.ndarray) -> tuple[float, float, float]:  # pragma: no cover - compiled
    """``Σ A_ij B_ij``, ``Σ A_ij²``, ``Σ B_ij²`` with the double-centred terms built on the fly."""
    n = x.size
    ma = ax / n
    mb = by / n
    ga = ma.sum() / n
    gb = mb.sum() / n
    sab = 0.0
    saa = 0.0
    sbb = 0.0
    for i in range(n):
        for j in range(n):
            a = abs(x[i] - x[j]) - ma[i] - ma[j] + ga
            b = abs(y[i] - y[j]) - mb[i] - mb[j] + gb
            sab += a * b
            saa += a * a
            sbb += b * b
    return sab, saa, sbb


@njit(cache=True, error_model="numpy", nogil=True)
def _cross_sum(xs: np.ndarray, ys: np.ndarray, ry: np.ndarray, m: int) -> float:  # pragma: no cover - compiled
    """``Σ_{i,j} |x_i - x_j| |y_i - y_j|`` for ``xs`` ascending, ``ry`` the dense 1-based ranks of ``ys``."""
    n = xs.size
    cnt = np.zeros(m + 1)
    sx = np.zeros(m + 1)
    sy = np.zeros(m + 1)
    sxy = np.zeros(m + 1)
    all_c = 0.0
    all_x = 0.0
    all_y = 0.0
    all_xy = 0.0
    total = 0.0
    for i in range(n):
        xi = xs[i]
        yi = ys[i]
        c = 0.0
        qx = 0.0
        qy = 0.0
        qxy = 0.0
        k = ry[i] - 1  # ranks strictly below y_i
        while k > 0:
            c += cnt[k]
            qx += sx[k]
            qy += sy[k]
            qxy += sxy[k]
            k -= k & -k
        below = xi * yi * c - xi * qy - yi * qx + qxy
        every = xi * yi * all_c - xi * all_y - yi * all_x + all_xy
        total += 2.0 * below - every
        k = ry[i]
        while k <= m:
            cnt[k] += 1.0
            sx[k] += xi
            sy[k] += yi
            sxy[k] += xi * yi
            k += k & -k
        all_c += 1.0
        all_x += xi
        all_y += yi
        all_xy += xi * yi
    return 2.0 * total


def _normalised(v: np.ndarray) -> np.ndarray:
    c = v - np.median(v)
    top = float(np.max(np.abs(c))) if c.size else 0.0
    return c / top if top > 0.0 else np.zeros_like(c)


def _fast(x: np.ndarray, y: np.ndarray, ax: np.ndarray, by: np.ndarray,
          ox: np.ndarray, oy: np.ndarray) -> tuple[float, float, float]:
    n = x.size
    ys = y[oy]
    ranks = np.empty(n, dtype=np.int64)
    ranks[oy] = np.cumsum(np.concatenate(([1], (ys[1:] != ys[:-1]).astype(np.int64))))
    cross = _cross_sum(x[ox], y[ox], ranks[ox], int(ranks.max()))
    saa = 2.0 * n * n * float(np.var(x))  # Σ a_ij² = Σ (x_i - x_j)²
    sbb = 2.0 * n * n * float(np.var(y))
    sa, sb = float(ax.sum()), float(by.sum())
    # Σ A_ij B_ij = Σ a_ij b_ij - (2/n) Σ a_i. b_i. + a.. b.. / n²
    sab = cross - 2.0 * float(ax @ by) / n + sa * sb / (n * n)
    return sab, saa - 2.0 * float(ax @ ax) / n + sa * sa / (n * n), sbb - 2.0 * float(by @ by) / n + sb * sb / (n * n)


def distance_correlation_sqr(x: np.ndarray, y: np.ndarray, method: str = "auto") -> float:
    """The squared distance correlation in [0, 1] (0.0 when either side is constant or has < 2 values).

    ``method`` is ``"auto"`` (``"direct"`` up to :data:`DIRECT_MAX_N` samples, ``"fast"`` above),
    ``"direct"`` (O(n²)) or ``"fast"`` (O(n log n)).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)} (got {method!r})")
    xa = np.ascontiguousarray(x, dtype=np.float64).ravel()
    ya = np.ascontiguousarray(y, dtype=np.float64).ravel()
    if xa.shape != ya.shape:
        raise ValueError(f"x and y must have the same length (got {xa.size} and {ya.size})")
    if not (np.isfinite(xa).all() and np.isfinite(ya).all()):
        raise ValueError("x and y must be finite")
    if xa.size < 2:
        return 0.0
    xa, ya = _normalised(xa), _normalised(ya)
    ox, oy = np.argsort(xa, kind="stable"), np.argsort(ya, kind="stable")
    ax, by = _row_sums(xa, ox), _row_sums(ya, oy)
    if method == "direct" or (method == "auto" and xa.size <= DIRECT_MAX_N):
        sab, saa, sbb = _direct(xa, ya, ax, by)
    else:
        sab, saa, sbb = _fast(xa, ya, ax, by, ox, oy)
    den = math.sqrt(saa * sbb) if saa > 0.0 and sbb > 0.0 else 0.0
    if den == 0.0 or not math.isfinite(sab):
        return 0.0
    return min(max(sab / den, 0.0), 1.0)


def distance_correlation(x: np.ndarray, y: np.ndarray, method: str = "auto") -> float:
    """The distance correlation in [0, 1]: ``sqrt`` of :func:`distance_correlation_sqr`."""
    return math.sqrt(distance_correlation_sqr(x, y, method))


def warm_up() -> None:
    """Compile (or load from the numba cache) both kernels, so the first real call is not the slow one."""
    x = np.linspace(0.0, 1.0, 8)
    distance_correlation(x, x[::-1] ** 2, "direct")
    distance_correlation(x, x[::-1] ** 2, "fast")
