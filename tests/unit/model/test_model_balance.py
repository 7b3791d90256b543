from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.model.balance import fd_bin_edges, fd_capped_sample, stratified_sample

QUANTILES = range(5, 100, 5)


def _population(kind: int, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == 0:
        return rng.lognormal(4.0, 1.0, n)  # long right tail, like RTT
    if kind == 1:
        return rng.normal(100.0, 10.0, n)
    if kind == 2:
        return np.round(rng.exponential(5.0, n))  # many ties
    return np.r_[rng.normal(50, 5, n // 2), rng.normal(500, 50, n - n // 2)]  # bimodal (CPU vs GPU)


def assert_quantiles_preserved(y: np.ndarray, idx: np.ndarray) -> None:
    sample = y[idx]
    for q in QUANTILES:
        got = np.percentile(sample, q)
        lo, hi = np.percentile(y, [q - 1, q + 1])
        assert lo <= got <= hi, f"q{q}: sample {got} outside population [{lo}, {hi}]"


def test_seeded_lognormal_keeps_every_quantile_within_one_point():
    rng = np.random.default_rng(42)
    y = rng.lognormal(4.0, 1.0, 100_000)
    idx = stratified_sample(y, 5_000, rng=np.random.default_rng(7))
    assert idx.size == 5_000
    assert np.unique(idx).size == idx.size
    assert np.all(np.diff(idx) > 0), "indices are sorted, so rows stay in time order"
    assert_quantiles_preserved(y, idx)


@settings(max_examples=60, deadline=None)
@given(
    kind=st.integers(0, 3),
    max_samples=st.integers(200, 2_000),
    factor=st.floats(1.01, 20.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_stratified_sample_preserves_quantiles(kind, max_samples, factor, seed):
    rng = np.random.default_rng(seed)
    n = min(int(max_samples * factor) + 1, 40_000)
    y = _population(kind, n, rng)
    idx = stratified_sample(y, max_samples, rng=rng)
    assert idx.size == max_samples
    assert np.unique(idx).size == max_samples
    assert idx.min() >= 0 and idx.max() < n
    assert_quantiles_preserved(y, idx)


def test_small_sets_are_returned_whole_and_runs_are_reproducible():
    y = np.arange(50.0)
    assert stratified_sample(y, 100).tolist() == list(range(50))
    big = np.random.default_rng(0).exponential(10, 5_000)
    a = stratified_sample(big, 300, rng=np.random.default_rng(3))
    b = stratified_sample(big, 300, rng=np.random.default_rng(3))
    c = stratified_sample(big, 300, rng=np.random.default_rng(4))
    assert a.tolist() == b.tolist()
    assert a.tolist() != c.tolist()


@pytest.mark.parametrize("bad", [np.array([1.0, np.nan]), np.array([[1.0, 2.0]]), np.array([np.inf, 1.0])])
def test_rejects_non_finite_or_non_1d(bad):
    with pytest.raises(ValueError, match="y must"):
        stratified_sample(bad, 1)


def test_rejects_bad_sizes():
    with pytest.raises(ValueError, match="max_samples"):
        stratified_sample(np.arange(10.0), 0)
    with pytest.raises(ValueError, match="n_buckets"):
        stratified_sample(np.arange(10.0), 5, n_buckets=0)
    with pytest.raises(ValueError, match="cap_per_bin"):
        fd_capped_sample(np.arange(10.0), 0)


def test_fd_capped_sample_caps_each_bin_and_keeps_rare_values():
    rng = np.random.default_rng(0)
    y = np.r_[rng.normal(100, 5, 10_000), rng.normal(1_000, 5, 20)]  # a rare slow mode
    idx = fd_capped_sample(y, 50, rng=np.random.default_rng(1))
    edges = fd_bin_edges(y)
    counts, _ = np.histogram(y[idx], bins=edges)
    assert counts.max() <= 50
    full, _ = np.histogram(y, bins=edges)
    assert np.array_equal(counts, np.minimum(full, 50)), "a bin keeps min(count, cap) rows"
    assert (y[idx] > 500).sum() == 20, "every row of the rare mode survives"
    assert np.all(np.diff(idx) > 0)


def test_fd_capped_sample_of_a_constant_is_one_bin():
    idx = fd_capped_sample(np.full(100, 3.0), 7)
    assert idx.size == 7
