"""The five association measures: reference values, NaN/inf policy, degenerate columns, invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from app.errors import RttError
from app.features.measures import (
    MEASURES,
    SIGNED,
    MeasureError,
    association,
    distance_correlation,
    kendall,
    measure_table,
    pearson,
    spearman,
    strength,
)

finite = st.floats(allow_nan=False, allow_infinity=False)  # the whole float64 range, subnormals included
pairs = st.integers(min_value=0, max_value=40).flatmap(
    lambda n: st.tuples(
        st.lists(st.one_of(finite, st.sampled_from([0.0, 1.0])), min_size=n, max_size=n),
        st.lists(st.one_of(finite, st.sampled_from([0.0, 1.0])), min_size=n, max_size=n),
    )
)


def _naive_dcor(x: np.ndarray, y: np.ndarray) -> float:
    """Distance correlation from its definition (double-centred distance matrices, V-statistics)."""

    def centred(v: np.ndarray) -> np.ndarray:
        d = np.abs(v[:, None] - v[None, :])
        return d - d.mean(axis=0) - d.mean(axis=1)[:, None] + d.mean()

    a, b = centred(x), centred(y)
    return float(np.sqrt((a * b).mean() / np.sqrt((a * a).mean() * (b * b).mean())))


def _mid_ranks(v: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of the ranks they span: (below) + (ties + 1) / 2."""
    return np.array([np.sum(v < a) + (np.sum(v == a) + 1) / 2 for a in v])


def _naive_spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson's r of the mid-ranks, from its sums (no ties: 1 - 6 sum d^2 / (n (n^2 - 1)))."""
    rx, ry = _mid_ranks(x) - (x.size + 1) / 2, _mid_ranks(y) - (y.size + 1) / 2
    return float(np.sum(rx * ry) / np.sqrt(np.sum(rx * rx) * np.sum(ry * ry)))


def _naive_kendall_b(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall's tau-b from its definition: (C - D) / sqrt((pairs - ties in x) (pairs - ties in y))."""
    concordant = discordant = tied_x = tied_y = 0
    for i in range(x.size):
        for j in range(i + 1, x.size):
            s = np.sign(x[i] - x[j]) * np.sign(y[i] - y[j])
            concordant += s > 0
            discordant += s < 0
            tied_x += x[i] == x[j]
            tied_y += y[i] == y[j]
    pairs = x.size * (x.size - 1) // 2
    return float((concordant - discordant) / np.sqrt((pairs - tied_x) * (pairs - tied_y)))


@pytest.fixture(scope="module")
def sample() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    x = rng.normal(size=300)
    return x, 0.5 * x + np.exp(x) + rng.normal(size=300)


def test_values_agree_with_the_definitions(sample) -> None:
    x, y = sample
    assert pearson(x, y) == pytest.approx(stats.pearsonr(x, y).statistic, abs=1e-12)
    assert spearman(x, y) == pytest.approx(_naive_spearman(x, y), abs=1e-12)
    assert kendall(x, y) == pytest.approx(_naive_kendall_b(x, y), abs=1e-12)
    assert distance_correlation(x, y) == pytest.approx(_naive_dcor(x, y), abs=1e-9)


def test_hand_computed_ranks_with_ties() -> None:
    """x has a tied pair, y a tied triple: 10 pairs, 1 tied in x, 3 tied in y; C = 5, D = 1."""
    x = np.array([1.0, 2.0, 2.0, 3.0, 5.0])
    y = np.array([1.0, 3.0, 1.0, 1.0, 4.0])
    assert kendall(x, y) == pytest.approx(4 / np.sqrt(9 * 7), abs=1e-12)
    # mid-ranks 1, 2.5, 2.5, 4, 5 and 2, 4, 2, 2, 5; centred: sum of products 5, of squares 9.5 and 8
    assert spearman(x, y) == pytest.approx(5 / np.sqrt(9.5 * 8), abs=1e-12)
    assert _naive_kendall_b(x, y) == pytest.approx(kendall(x, y), abs=1e-15)
    assert _naive_spearman(x, y) == pytest.approx(spearman(x, y), abs=1e-15)


@settings(max_examples=40, deadline=None)
@given(st.integers(4, 30).flatmap(lambda n: st.tuples(
    st.lists(st.integers(-3, 3).map(float), min_size=n, max_size=n),
    st.lists(st.integers(-3, 3).map(float), min_size=n, max_size=n))))
def test_rank_measures_equal_their_definitions_under_heavy_ties(pair) -> None:
    x, y = (np.array(v) for v in pair)
    if np.ptp(x) == 0.0 or np.ptp(y) == 0.0:
        assert spearman(x, y) == 0.0 and kendall(x, y) == 0.0  # degenerate by policy
        return
    assert spearman(x, y) == pytest.approx(_naive_spearman(x, y), abs=1e-12)
    assert kendall(x, y) == pytest.approx(_naive_kendall_b(x, y), abs=1e-12)


def test_signed_measures_keep_the_sign_and_strength_drops_it(sample) -> None:
    x, y = sample
    for m in SIGNED:
        assert association(m, x, -y) < 0
        assert strength(m, x, -y) == pytest.approx(abs(association(m, x, y)), abs=1e-12)


def test_dcor_and_mic_see_a_non_monotone_relation_the_correlations_miss() -> None:
    x = np.linspace(-1, 1, 401)
    y = x ** 2
    assert abs(pearson(x, y)) < 0.05 and abs(spearman(x, y)) < 0.05 and abs(kendall(x, y)) < 0.05
    assert distance_correlation(x, y) > 0.4
    assert association("mic", x, y) > 0.9


def test_nan_rows_are_dropped_pairwise(sample) -> None:
    x, y = (v.copy() for v in sample)
    x[3], y[10] = np.nan, np.nan
    keep = np.ones(x.size, bool)
    keep[[3, 10]] = False
    for m in MEASURES:
        assert association(m, x, y) == pytest.approx(association(m, x[keep], y[keep]), abs=1e-12)


def test_infinity_is_rejected_with_the_column_name() -> None:
    x = np.arange(10.0)
    x[2] = np.inf
    with pytest.raises(MeasureError, match="infinite"):
        pearson(x, np.arange(10.0))
    with pytest.raises(RttError, match="bad_col"):
        measure_table(np.column_stack([np.arange(10.0), x]), np.arange(10.0), ["ok", "bad_col"])


def test_degenerate_columns_score_zero_and_are_listed() -> None:
    rng = np.random.default_rng(3)
    y = rng.normal(size=50)
    short = np.full(50, np.nan)
    short[:3] = [1.0, 2.0, 3.0]
    X = np.column_stack([y + rng.normal(size=50), np.full(50, 7.0), short])
    table = measure_table(X, y, ["good", "constant", "short"])
    assert table.degenerate == ("constant", "short")
    assert (table.strength[1:] == 0.0).all() and (table.strength[0] > 0.0).all()
    assert table.n_used.tolist() == [50, 50, 3]
    assert set(table.seconds) == set(MEASURES)


def test_mic_on_threads_gives_the_values_of_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from app.features import measures

    rng = np.random.default_rng(5)
    X = rng.uniform(size=(300, 6))
    X[:40, 2], X[:, 4] = np.nan, 3.0  # rows dropped for one column, a degenerate one
    y = X[:, 0] + np.sin(6 * X[:, 1]) + rng.normal(0, 0.1, 300)
    names = [f"c{i}" for i in range(6)]
    one = measure_table(X, y, names, threads=1)
    kernel, seen = measures._KERNELS["mic"], set()

    def mic(x: np.ndarray, y_: np.ndarray) -> float:
        seen.add(threading.get_ident())
        return kernel(x, y_)

    monkeypatch.setitem(measures._KERNELS, "mic", mic)
    many = measure_table(X, y, names, threads=3)
    assert len(seen) > 1 and threading.get_ident() not in seen  # the MIC values came from the pool
    assert np.array_equal(one.signed, many.signed) and one.degenerate == many.degenerate == ("c4",)
    assert one.n_used.tolist() == many.n_used.tolist() and many.seconds["mic"] > 0


def test_a_constant_target_makes_every_column_degenerate() -> None:
    table = measure_table(np.random.default_rng(0).normal(size=(20, 2)), np.ones(20), ["a", "b"])
    assert table.degenerate == ("a", "b")


def test_bad_shapes_and_unknown_measures_raise() -> None:
    with pytest.raises(MeasureError, match="same length"):
        pearson(np.arange(5.0), np.arange(4.0))
    with pytest.raises(MeasureError, match="unknown"):
        association("cosine", np.arange(5.0), np.arange(5.0))
    with pytest.raises(MeasureError, match="one column per name"):
        measure_table(np.zeros((5, 2)), np.arange(5.0), ["only_one"])


@settings(max_examples=80, deadline=None)
@given(pairs)
def test_every_measure_is_finite_and_in_range(pair) -> None:
    x, y = (np.array(v, dtype=float) for v in pair)
    for m in MEASURES:
        v = association(m, x, y)
        assert np.isfinite(v)
        assert (-1.0 if m in SIGNED else 0.0) <= v <= 1.0
        assert 0.0 <= strength(m, x, y) <= 1.0


@settings(max_examples=60, deadline=None)
@given(pairs)
def test_every_measure_is_symmetric(pair) -> None:
    x, y = (np.array(v, dtype=float) for v in pair)
    for m in MEASURES:
        assert association(m, x, y) == pytest.approx(association(m, y, x), abs=1e-9)
