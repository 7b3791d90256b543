"""Our distance correlation against the ``dcor`` package (the biased estimator it computes by default)."""

from __future__ import annotations

import subprocess
import sys

import dcor  # test-time reference only (dev extra)
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from app.features.dcor_fast import DIRECT_MAX_N, distance_correlation, distance_correlation_sqr, warm_up
from app.features.measures import association

TOL = 1e-9
METHODS = ("auto", "direct", "fast")

# Finite values with many ties: small integers, a tie-prone pair of constants, and floats of any exponent in
# a range where dcor's own sums do not cancel away (it works on the raw values, without centring them).
value = st.one_of(
    st.integers(-20, 20).map(float),
    st.sampled_from([0.0, 1.0]),
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
)
pairs = st.integers(min_value=2, max_value=60).flatmap(
    lambda n: st.tuples(st.lists(value, min_size=n, max_size=n), st.lists(value, min_size=n, max_size=n))
)

wide = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([0.0, 1.0]))
wide_pairs = st.integers(min_value=0, max_value=40).flatmap(
    lambda n: st.tuples(st.lists(wide, min_size=n, max_size=n), st.lists(wide, min_size=n, max_size=n))
)


def _reference(x: np.ndarray, y: np.ndarray) -> float:
    return float(dcor.distance_correlation(x, y))


def _conditioned(v: np.ndarray) -> np.ndarray:
    """``v`` shifted by its minimum and scaled by a power of two to a spread near 1, for dcor's sake.

    dcor sums products of the raw values, so a spread lost in the magnitude cancels away and a spread below
    ~1e-154 underflows when squared. Distance correlation is invariant to both maps, and both are exact here
    where it matters: ``v_i - min`` is exact whenever the spread is small against the magnitude (Sterbenz),
    and a power of two only moves the exponent.
    """
    shifted = v - v.min()
    spread = float(shifted.max())
    return shifted if spread == 0.0 else np.ldexp(shifted, -int(np.frexp(spread)[1]))


def _reference_any(x: np.ndarray, y: np.ndarray) -> float:
    return _reference(_conditioned(x), _conditioned(y))


@pytest.fixture(scope="module", autouse=True)
def _compiled() -> None:
    warm_up()


@settings(max_examples=150, deadline=None)
@given(pairs)
@example(([1e6, 1e6 + 1e-4, 1e6 + 2e-4, 1e6 + 5e-4, 1e6], [0.0, 1.0, 2.0, 3.0, 1.0]))  # spread 5e-10 of the value
@example(([5e-324, 0.0, 1e-323, 0.0, 2e-323], [1.0, 2.0, 3.0, 5.0, -1.0]))  # subnormal spread
@example(([1e-200, -3e-201, 2e-200], [3.0, 1.0, 2.0]))  # squares underflow
def test_equals_dcor_on_random_inputs_with_ties_constants_and_tiny_spreads(pair) -> None:
    x, y = (np.array(v, dtype=float) for v in pair)
    ref = _reference_any(x, y)
    for method in METHODS:
        assert distance_correlation(x, y, method) == pytest.approx(ref, abs=TOL)
    if np.ptp(x) == 0.0 or np.ptp(y) == 0.0:
        assert distance_correlation(x, y) == 0.0


@settings(max_examples=100, deadline=None)
@given(wide_pairs)
def test_symmetric_and_in_unit_interval_over_the_whole_float_range(pair) -> None:
    x, y = (np.array(v, dtype=float) for v in pair)
    for method in METHODS:
        v = distance_correlation(x, y, method)
        assert 0.0 <= v <= 1.0
        assert v == pytest.approx(distance_correlation(y, x, method), abs=TOL)


# the assumption below discards most pairs of tiny spreads (about 6 in 7 drawn): expected, not a slow strategy
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(pairs, st.floats(1e-6, 1e6), st.floats(-1e3, 1e3))
def test_invariant_to_shift_and_scale(pair, scale: float, shift: float) -> None:
    x, y = (np.array(v, dtype=float) for v in pair)
    moved = scale * x + shift
    # in floating point the map keeps x's differences only where they are not rounded away next to the shift
    # (x = [0, 5e-294] plus 1 is [1, 1]): the smallest gap, scaled, must stand well above the rounding of |moved|
    gaps = np.diff(np.unique(x))
    assume(gaps.size == 0 or gaps.min() * scale >= 1e-6 * max(1.0, float(np.abs(moved).max())))
    base = distance_correlation(x, y)
    assert distance_correlation(scale * x + shift, y) == pytest.approx(base, abs=1e-7)
    assert distance_correlation(x, -y) == pytest.approx(base, abs=TOL)


@pytest.mark.parametrize("n", [DIRECT_MAX_N + 1, 1000, 5000])
def test_large_samples_fast_and_direct_agree_with_dcor(n: int) -> None:
    rng = np.random.default_rng(n)
    x = np.round(rng.normal(size=n), 1)  # heavy ties
    y = np.sin(3 * x) + rng.normal(scale=0.3, size=n)
    ref = _reference(x, y)
    assert distance_correlation(x, y) == pytest.approx(ref, abs=TOL)
    assert distance_correlation(x, y, "fast") == pytest.approx(ref, abs=TOL)
    if n <= 1000:
        assert distance_correlation(x, y, "direct") == pytest.approx(ref, abs=TOL)


def test_perfect_dependence_is_one_and_independence_is_small() -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=2000)
    assert distance_correlation(x, 5 * x - 3) == pytest.approx(1.0, abs=1e-12)
    assert distance_correlation(x, rng.normal(size=2000)) < 0.1
    assert distance_correlation_sqr(x, x ** 2) == pytest.approx(distance_correlation(x, x ** 2) ** 2, abs=1e-12)


def test_nearly_constant_values_keep_their_precision() -> None:
    x = 1e6 + np.arange(50.0) * 1e-6  # spread 5e-5 on a magnitude of 1e6
    y = np.arange(50.0) ** 2
    assert distance_correlation(x, y) == pytest.approx(distance_correlation(np.arange(50.0), y), abs=1e-6)


def test_measures_uses_it_and_keeps_its_policy() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=300)
    y = x ** 2 + rng.normal(scale=0.1, size=300)
    assert association("dcor", x, y) == pytest.approx(_reference(x, y), abs=TOL)
    assert association("dcor", x, np.full(300, 4.0)) == 0.0
    assert association("dcor", x[:3], y[:3]) == 0.0  # fewer than MIN_SAMPLES rows is degenerate


def test_bad_input_raises_value_error() -> None:
    with pytest.raises(ValueError, match="method"):
        distance_correlation(np.arange(4.0), np.arange(4.0), "naive")
    with pytest.raises(ValueError, match="same length"):
        distance_correlation(np.arange(4.0), np.arange(5.0))
    with pytest.raises(ValueError, match="finite"):
        distance_correlation(np.array([0.0, np.inf, 1.0]), np.arange(3.0))
    assert distance_correlation(np.array([1.0]), np.array([2.0])) == 0.0


def test_feature_selection_never_imports_dcor() -> None:
    code = (
        "import sys, numpy as np\n"
        "import app.features.selection\n"
        "from app.features.measures import distance_correlation\n"
        "assert distance_correlation(np.arange(10.0), np.arange(10.0) ** 2) > 0.9\n"
        "sys.exit(3 if 'dcor' in sys.modules else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)  # noqa: S603
    assert done.returncode == 0, done.stderr
