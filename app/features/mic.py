"""Maximal information coefficient (MIC) and maximum asymmetry score (MAS), ApproxMaxMI of Reshef et al. 2011.

This follows the computation of minepy's ``mine_compute_score`` with ``est="mic_approx"`` step by step:
``B = max(n**alpha, 4)``; for every grid with ``x * y <= B`` one axis is equipartitioned into ``y`` rows
(ties kept together), the points are grouped into clumps along the other axis and, when there are more
than ``c * x`` clumps, into ``c * x`` superclumps; a dynamic programme over the superclump boundaries finds
the columns that maximise the mutual information, normalised by ``log(min(x, y))``. Both orientations
are computed and each grid keeps the larger score. MIC is the maximum of that characteristic matrix,
MAS the largest ``|M[x, y] - M[y, x]|``.

Only the order of the values matters (MIC is invariant under monotone maps of either variable), so it is
computed on float64 copies sorted once per orientation. The kernels are compiled by numba on first use
(cached on disk); :func:`warm_up` compiles them ahead of time. They release the GIL, so a retrain in a
background thread does not hold up the thread that serves placements.

>>> import numpy as np
>>> x = np.linspace(0, 1, 1000)
>>> round(mic(x, np.sin(10 * np.pi * x) + x), 4)
1.0
>>> round(mine(x, x ** 2).mas, 4)
0.0
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from numba import njit

DEFAULT_ALPHA = 0.6
DEFAULT_C = 15.0


# --- kernels (numba). Indices, loop bounds and tie handling follow minepy's mine.c; entropies use a k log k
# table, which changes results only at the ~1e-15 level.


@njit(cache=True, error_model="numpy", nogil=True)
def _equipartition(d: np.ndarray, y: int, out: np.ndarray) -> int:  # pragma: no cover - compiled
    """Rows of (nearly) n/y sorted points each, equal values never split; returns the number of rows."""
    n = d.size
    rowsize = n / y
    i = 0
    h = 0
    curr = 0
    while i < n:
        s = 1
        while i + s < n and d[i + s] == d[i]:
            s += 1
        if h != 0 and abs(h + s - rowsize) >= abs(h - rowsize):
            curr += 1
            h = 0
            rowsize = (n - i) / (y - curr)
        out[i:i + s] = curr
        i += s
        h += s
    return curr + 1


@njit(cache=True, error_model="numpy", nogil=True)
def _superclumps(dx: np.ndarray, q_map: np.ndarray, k_hat: int, out: np.ndarray) -> int:  # pragma: no cover
    """Clumps: runs of x-sorted points in one row (tied x in several rows form one clump); at most k_hat."""
    n = dx.size
    qt = q_map.copy()
    i = 0
    label = -1
    while i < n:
        s = 1
        mixed = False
        while i + s < n and dx[i + s] == dx[i]:
            if qt[i + s] != qt[i]:
                mixed = True
            s += 1
        if s > 1 and mixed:
            qt[i:i + s] = label
            label -= 1
        i += s
    p = 0
    out[0] = 0
    for j in range(1, n):
        if qt[j] != qt[j - 1]:
            p += 1
        out[j] = p
    p += 1
    if p > k_hat:
        p = _equipartition(out.astype(np.float64), k_hat, out)
    return p


@njit(cache=True, error_model="numpy", nogil=True, inline="always")
def _best_split(cf: np.ndarray, gain: np.ndarray, h: np.ndarray, lo: int, hi: int,
                ct: float) -> float:  # pragma: no cover - compiled
    """``max(cf[s] * gain[s] - (ct - cf[s]) * h[s] for s in lo..hi-1)`` as eight independent maxima: the same
    number as one running maximum, as every term is finite (superclumps are never empty)."""
    b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = -np.inf
    s = lo
    while s + 8 <= hi:
        b0 = max(b0, cf[s] * gain[s] - (ct - cf[s]) * h[s])
        b1 = max(b1, cf[s + 1] * gain[s + 1] - (ct - cf[s + 1]) * h[s + 1])
        b2 = max(b2, cf[s + 2] * gain[s + 2] - (ct - cf[s + 2]) * h[s + 2])
        b3 = max(b3, cf[s + 3] * gain[s + 3] - (ct - cf[s + 3]) * h[s + 3])
        b4 = max(b4, cf[s + 4] * gain[s + 4] - (ct - cf[s + 4]) * h[s + 4])
        b5 = max(b5, cf[s + 5] * gain[s + 5] - (ct - cf[s + 5]) * h[s + 5])
        b6 = max(b6, cf[s + 6] * gain[s + 6] - (ct - cf[s + 6]) * h[s + 6])
        b7 = max(b7, cf[s + 7] * gain[s + 7] - (ct - cf[s + 7]) * h[s + 7])
        s += 8
    while s < hi:
        b0 = max(b0, cf[s] * gain[s] - (ct - cf[s]) * h[s])
        s += 1
    return max(max(max(b0, b1), max(b2, b3)), max(max(b4, b5), max(b6, b7)))


@njit(cache=True, error_model="numpy", nogil=True)
def _optimize_x_axis(q_map: np.ndarray, q: int, p_map: np.ndarray, p: int, x: int, xlogx: np.ndarray,
                     score: np.ndarray) -> None:  # pragma: no cover - compiled
    """Best normalised MI for 2..x columns made of superclump boundaries (Algorithm 2 of the SOM).

    Entropies of counts ``k_i`` summing to ``T`` are ``log T - sum(k_i log k_i) / T`` with ``k log k`` read
    from the table ``xlogx``, so the O(p^2 q) part needs no logarithms.
    """
    n = q_map.size
    if p == 1:
        score[:] = 0.0
        return
    c = np.zeros(p, dtype=np.int64)
    cum = np.zeros((p, q), dtype=np.int64)  # cum[j, i]: points of row i in superclumps 0..j
    for i in range(n):
        c[p_map[i]] += 1
        cum[p_map[i], q_map[i]] += 1
    for j in range(1, p):
        c[j] += c[j - 1]
        for i in range(q):
            cum[j, i] += cum[j - 1, i]
    acc = 0.0
    for i in range(q):
        acc += xlogx[cum[p - 1, i]]
    hq = math.log(n) - acc / n
    head = np.zeros(p + 1)  # head[s] = sum_i k log k of the columns' first s superclumps
    for s in range(1, p + 1):
        acc = 0.0
        for i in range(q):
            acc += xlogx[cum[s - 1, i]]
        head[s] = acc
    hp2q = np.zeros((p + 1, p + 1))  # hp2q[t, s] = H(<c_s, c_t>, Q)
    im = np.zeros((x + 1, p + 1))  # im[l, t]: best MI with l columns over the first t superclumps
    for t in range(2, p + 1):
        ct = c[t - 1]
        best = -np.inf
        for s in range(1, t):
            tot = ct - c[s - 1]
            acc = 0.0
            for i in range(q):
                acc += xlogx[cum[t - 1, i] - cum[s - 1, i]]
            hp2q[t, s] = math.log(tot) - acc / tot
            f = (head[s] + acc - xlogx[c[s - 1]] - xlogx[tot]) / ct
            best = max(best, f)
        f = head[t] / ct - math.log(ct)  # s == t: a single column
        im[2, t] = hq + max(best, f)
    cf = np.zeros(p + 1)  # cf[s] = c[s - 1] as a float (cf[0] unused)
    for s in range(1, p + 1):
        cf[s] = float(c[s - 1])
    gain = np.zeros(p + 1)
    for ell in range(3, x + 1):
        for s in range(ell - 1, p + 1):
            gain[s] = im[ell - 1, s] - hq
        for t in range(ell, p + 1):
            im[ell, t] = hq + _best_split(cf, gain, hp2q[t], ell - 1, t + 1, cf[t]) / cf[t]
    for i in range(p + 1, x + 1):
        im[i, p] = im[p, p]
    for i in range(2, x + 1):
        score[i - 2] = im[i, p] / min(math.log(i), math.log(q))


@njit(cache=True, error_model="numpy", nogil=True)
def _characteristic_matrix(xa: np.ndarray, ya: np.ndarray, ix: np.ndarray, iy: np.ndarray,
                           b: float, c: float) -> np.ndarray:  # pragma: no cover - compiled
    n = xa.size
    xx = xa[ix]
    yy = ya[iy]
    rows = max(int(math.floor(b / 2.0)), 2) - 1
    m = np.empty(rows, dtype=np.int64)
    for i in range(rows):
        m[i] = int(math.floor(b / (i + 2))) - 1
    out = np.full((rows, m[0]), np.nan)
    tmp = np.empty(n, dtype=np.int64)
    q_map = np.empty(n, dtype=np.int64)
    p_map = np.empty(n, dtype=np.int64)
    score = np.empty(m[0], dtype=np.float64)
    xlogx = np.zeros(n + 1)
    for k in range(2, n + 1):
        xlogx[k] = k * math.log(k)
    for orient in range(2):
        for i in range(rows):
            k = max(int(c * (m[i] + 1)), 1)
            if orient == 0:  # equipartition y into i + 2 rows, optimise the columns on x
                q = _equipartition(yy, i + 2, q_map)
                tmp[iy] = q_map
                q_map[:] = tmp[ix]
                p = _superclumps(xx, q_map, k, p_map)
            else:  # equipartition x into i + 2 columns, optimise the rows on y
                q = _equipartition(xx, i + 2, q_map)
                tmp[ix] = q_map
                q_map[:] = tmp[iy]
                p = _superclumps(yy, q_map, k, p_map)
            _optimize_x_axis(q_map, q, p_map, p, m[i] + 1, xlogx, score)
            for j in range(m[i]):
                if orient == 0:
                    out[i, j] = score[j]
                elif score[j] > out[j, i]:
                    out[j, i] = score[j]
    return out


@dataclasses.dataclass(frozen=True)
class MineResult:
    """MIC, MAS and the characteristic matrix of one pair of variables.

    ``matrix[i, j]`` is the normalised mutual information of the best grid with ``i + 2`` rows (y) and
    ``j + 2`` columns (x); cells outside ``(i + 2) * (j + 2) <= B`` are NaN.
    """

    mic: float
    mas: float
    matrix: np.ndarray


def _grid_bound(n: int, alpha: float) -> float:
    return max(math.pow(n, alpha), 4.0)


def _check(alpha: float, c: float) -> None:
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha: must be in (0, 1] (got {alpha})")
    if not c > 0.0:
        raise ValueError(f"c: must be > 0 (got {c})")


def mine(x: np.ndarray, y: np.ndarray, alpha: float = DEFAULT_ALPHA, c: float = DEFAULT_C) -> MineResult:
    """MIC and MAS of two equally long finite vectors (ApproxMaxMI, minepy's ``mic_approx``).

    Parameters
    ----------
    x, y:
        Finite values, same length. Fewer than 4 points or a constant vector give MIC = MAS = 0.
    alpha:
        Grid-size exponent, ``B = max(n**alpha, 4)``; minepy's default 0.6.
    c:
        At most ``c * x`` superclumps are considered for a grid of ``x`` columns; minepy's default 15.

    Returns
    -------
    MineResult
        ``mic`` and ``mas`` in [0, 1].
    """
    _check(alpha, c)
    xa = np.ascontiguousarray(x, dtype=np.float64).ravel()
    ya = np.ascontiguousarray(y, dtype=np.float64).ravel()
    if xa.shape != ya.shape:
        raise ValueError(f"x and y must have the same length (got {xa.size} and {ya.size})")
    n = xa.size
    if n < 4 or not (np.isfinite(xa).all() and np.isfinite(ya).all()):
        if n >= 4:
            raise ValueError("x and y must be finite (drop NaN rows first)")
        return MineResult(0.0, 0.0, np.zeros((1, 1)))
    b = _grid_bound(n, alpha)
    ix = np.argsort(xa, kind="stable")
    iy = np.argsort(ya, kind="stable")
    m = _characteristic_matrix(xa, ya, ix.astype(np.int64), iy.astype(np.int64), b, c)
    return MineResult(_mic(m), _mas(m), m)


def _mic(m: np.ndarray) -> float:
    top = float(np.nanmax(m)) if np.isfinite(m).any() else 0.0
    return min(max(top, 0.0), 1.0)


def _mas(m: np.ndarray) -> float:
    k = min(m.shape)
    sq = m[:k, :k]
    diff = np.abs(sq - sq.T)
    top = float(np.nanmax(diff)) if np.isfinite(diff).any() else 0.0
    return min(max(top, 0.0), 1.0)


def mic(x: np.ndarray, y: np.ndarray, alpha: float = DEFAULT_ALPHA, c: float = DEFAULT_C) -> float:
    """The maximal information coefficient of ``x`` and ``y`` in [0, 1]; see :func:`mine`.

    >>> import numpy as np
    >>> mic(np.arange(10.0), np.arange(10.0) ** 3)
    1.0
    >>> mic(np.arange(10.0), np.ones(10))
    0.0
    """
    return mine(x, y, alpha, c).mic


def warm_up() -> None:
    """Compile (or load from the numba cache) the kernels, so the first real call is not the slow one."""
    x = np.linspace(0.0, 1.0, 16)
    mine(x, x[::-1] ** 2)
