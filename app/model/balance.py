"""Training-set balancing: cap the number of rows a model trains on while keeping the RTT distribution.

Two strategies, both returning sorted row indices (rows stay in time order):

* :func:`stratified_sample` — RTT split into equal-count percentile buckets, each bucket gets its
  proportional share of ``max_samples``, and inside a bucket the rows are drawn one per equal run of
  RTT ranks (stratified down to the row). The sample's quantiles stay within a fraction of a percentile
  point of the population's.
* :func:`fd_capped_sample` — Freedman–Diaconis histogram of RTT, each bin capped at a fixed count.
  This flattens the distribution (common RTTs are thinned, rare ones all kept): the alternative for
  when the tails matter more than the bulk.

>>> import numpy as np
>>> y = np.arange(1000, dtype=float)
>>> idx = stratified_sample(y, 10, n_buckets=5, rng=np.random.default_rng(0))
>>> len(idx), bool(np.all(np.diff(idx) > 0))
(10, True)
>>> [int(i) // 100 for i in idx]
[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
"""

from __future__ import annotations

import numpy as np

MAX_FD_BINS = 10_000  # a long tail must not turn into millions of empty bins


def _check_y(y: np.ndarray) -> np.ndarray:
    arr = np.asarray(y, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"y must be 1-D (got shape {arr.shape})")
    if not np.all(np.isfinite(arr)):
        raise ValueError("y must be finite (drop rows without an observed RTT first)")
    return arr


def _proportional_quotas(edges: np.ndarray, total: int) -> np.ndarray:
    """Split ``total`` over the buckets ``edges[i]:edges[i+1]`` in proportion to their sizes.

    Cumulative rounding: the first ``k`` buckets together get within half a row of their exact share,
    for every ``k`` — no drift of the sample's quantiles however the remainders fall.

    >>> _proportional_quotas(np.array([0, 10, 20, 30, 40]), 6).tolist()
    [2, 1, 2, 1]
    """
    cumulative = np.floor(edges.astype(np.float64) * total / edges[-1] + 0.5).astype(np.int64)
    return np.diff(cumulative)


def stratified_sample(
    y: np.ndarray,
    max_samples: int,
    n_buckets: int = 20,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Indices of at most ``max_samples`` rows whose RTT distribution matches ``y``'s.

    Parameters
    ----------
    y
        Observed RTT (any unit), 1-D and finite.
    max_samples
        Size cap; when ``len(y) <= max_samples`` every index is returned.
    n_buckets
        Number of equal-count percentile buckets (20 = 5 % each).
    rng
        Source of randomness; ``None`` means ``numpy.random.default_rng(0)`` (reproducible).

    Returns
    -------
    numpy.ndarray
        Sorted int64 indices into ``y``.

    Notes
    -----
    Buckets are made from RTT ranks, so ties never produce empty or oversized buckets. Inside a bucket
    of ``s`` rows with quota ``k``, the sorted rows are cut into ``k`` runs of about ``s / k`` and one row
    is drawn uniformly from each run. Each sample quantile therefore sits within about
    ``len(y) / max_samples`` ranks of the population's, i.e. within 1 percentile point once
    ``max_samples >= 200``.
    """
    arr = _check_y(y)
    if max_samples < 1:
        raise ValueError(f"max_samples must be >= 1 (got {max_samples})")
    if n_buckets < 1:
        raise ValueError(f"n_buckets must be >= 1 (got {n_buckets})")
    n = arr.size
    if n <= max_samples:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(0) if rng is None else rng
    order = np.argsort(arr, kind="stable")
    n_buckets = min(n_buckets, max_samples)
    edges = (np.arange(n_buckets + 1, dtype=np.int64) * n) // n_buckets
    sizes = np.diff(edges)
    quotas = _proportional_quotas(edges, max_samples)
    picks: list[np.ndarray] = []
    for start, size, k in zip(edges[:-1], sizes, quotas, strict=True):
        if k <= 0:
            continue
        runs = start + (np.arange(k + 1, dtype=np.int64) * size) // k
        lengths = np.diff(runs)
        picks.append(runs[:-1] + (rng.random(k) * lengths).astype(np.int64))
    return np.sort(order[np.concatenate(picks)])


def fd_bin_edges(y: np.ndarray) -> np.ndarray:
    """Freedman–Diaconis bin edges of ``y`` (width ``2 * IQR / n^(1/3)``), at most ``MAX_FD_BINS`` bins.

    >>> fd_bin_edges(np.array([1.0, 2.0, 3.0, 4.0, 100.0])).size > 2
    True
    >>> fd_bin_edges(np.array([5.0, 5.0, 5.0])).tolist()
    [5.0, 5.0]
    """
    arr = _check_y(y)
    lo, hi = float(arr.min()), float(arr.max())
    if hi == lo:
        return np.array([lo, hi])
    q25, q75 = np.percentile(arr, [25, 75])
    width = 2.0 * (q75 - q25) / arr.size ** (1.0 / 3.0)
    n_bins = MAX_FD_BINS if width <= 0 else int(np.clip(np.ceil((hi - lo) / width), 1, MAX_FD_BINS))
    return np.linspace(lo, hi, n_bins + 1)


def fd_capped_sample(y: np.ndarray, cap_per_bin: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """Indices keeping at most ``cap_per_bin`` rows (drawn at random) of each Freedman–Diaconis bin.

    >>> y = np.r_[np.zeros(90), np.arange(1.0, 11.0)]
    >>> idx = fd_capped_sample(y, 5, rng=np.random.default_rng(1))
    >>> int((y[idx] == 0).sum()), int((y[idx] > 0).sum()) <= 10
    (5, True)
    """
    arr = _check_y(y)
    if cap_per_bin < 1:
        raise ValueError(f"cap_per_bin must be >= 1 (got {cap_per_bin})")
    if arr.size == 0:
        return np.arange(0, dtype=np.int64)
    rng = np.random.default_rng(0) if rng is None else rng
    edges = fd_bin_edges(arr)
    bins = np.clip(np.searchsorted(edges, arr, side="right") - 1, 0, max(edges.size - 2, 0))
    # random order, then keep the first cap_per_bin rows of each bin
    perm = rng.permutation(arr.size)
    by_bin = perm[np.argsort(bins[perm], kind="stable")]
    sorted_bins = bins[by_bin]
    first = np.searchsorted(sorted_bins, sorted_bins, side="left")
    keep = (np.arange(arr.size) - first) < cap_per_bin
    return np.sort(by_bin[keep]).astype(np.int64)
