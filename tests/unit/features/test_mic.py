"""MIC / MAS: minepy's reference values, invariants (range, symmetry, rank invariance) and input checks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import rankdata

from app.features.mic import mic, mine

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
# few distinct values as well as many, so ties, constant columns and n < 4 all occur
pairs = st.integers(min_value=0, max_value=60).flatmap(
    lambda n: st.tuples(
        st.lists(st.one_of(finite, st.sampled_from([0.0, 1.0, 2.0])), min_size=n, max_size=n),
        st.lists(st.one_of(finite, st.sampled_from([0.0, 1.0, 2.0])), min_size=n, max_size=n),
    )
)


def test_sine_reference_values_of_minepy() -> None:
    """minepy's own example (docs/source/python.rst, examples/python_example.py: alpha 0.6, c 15), whose
    output is printed to 12 significant digits (and MIC with noise to 17 in the 0.3.5 docs)."""
    x = np.linspace(0, 1, 1000)
    y = np.sin(10 * np.pi * x) + x
    res = mine(x, y)
    assert res.mic == 1.0
    assert res.mas == pytest.approx(0.726071574374, abs=5e-13)
    noisy = mine(x, y + np.random.RandomState(0).uniform(-1, 1, x.shape[0]))  # the example's np.random.seed(0)
    assert noisy.mic == pytest.approx(0.50571669341737124, abs=1e-15)
    assert noisy.mas == pytest.approx(0.365399904262, abs=5e-13)


def test_characteristic_matrix_covers_exactly_the_grids_within_b() -> None:
    x = np.linspace(0, 1, 1000)
    m = mine(x, np.sin(10 * np.pi * x) + x).matrix
    b = 1000 ** 0.6
    assert m.shape == (30, 30)
    rows, cols = np.indices(m.shape)
    allowed = (rows + 2) * (cols + 2) <= b
    assert np.isfinite(m[allowed]).all()
    assert np.isnan(m[~allowed]).all()


@pytest.mark.parametrize("f", [lambda x: x ** 2, lambda x: np.sin(4 * np.pi * x), np.exp, lambda x: np.abs(x - 0.3)])
def test_noiseless_functions_score_near_one(f) -> None:
    x = np.random.default_rng(1).uniform(0, 1, 500)
    assert mic(x, f(x)) >= 0.9


def test_independent_uniforms_stay_near_the_null_level() -> None:
    rng = np.random.default_rng(2024)
    assert mic(rng.uniform(size=500), rng.uniform(size=500)) < 0.25


def test_noise_lowers_mic() -> None:
    rng = np.random.default_rng(5)
    x = rng.uniform(size=800)
    clean, noisy = mic(x, x ** 2), mic(x, x ** 2 + rng.normal(scale=0.3, size=800))
    assert noisy < clean - 0.2


@settings(max_examples=60, deadline=None)
@given(pairs)
def test_scores_are_finite_and_in_range(pair) -> None:
    x, y = (np.array(v, dtype=float) for v in pair)
    res = mine(x, y)
    assert 0.0 <= res.mic <= 1.0 and 0.0 <= res.mas <= 1.0
    assert res.mas <= res.mic + 1e-12


@settings(max_examples=60, deadline=None)
@given(pairs)
def test_mic_and_mas_are_symmetric(pair) -> None:
    x, y = (np.array(v, dtype=float) for v in pair)
    a, b = mine(x, y), mine(y, x)
    assert a.mic == pytest.approx(b.mic, abs=1e-9)
    assert a.mas == pytest.approx(b.mas, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(pairs)
def test_only_the_order_of_values_matters(pair) -> None:
    x, y = (np.array(v, dtype=float) for v in pair)
    assert mic(rankdata(x), rankdata(y) * 7 - 3) == pytest.approx(mic(x, y), abs=1e-9)


def test_constant_and_short_inputs_score_zero() -> None:
    assert mic(np.arange(50.0), np.full(50, 3.0)) == 0.0
    assert mic(np.arange(3.0), np.arange(3.0)) == 0.0


@pytest.mark.parametrize("kwargs, field", [({"alpha": 0.0}, "alpha"), ({"alpha": 1.5}, "alpha"), ({"c": 0.0}, "c")])
def test_bad_parameters_name_the_field(kwargs, field) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        mine(np.arange(10.0), np.arange(10.0), **kwargs)


def test_bad_inputs_are_rejected() -> None:
    with pytest.raises(ValueError, match="same length"):
        mine(np.arange(10.0), np.arange(9.0))
    with pytest.raises(ValueError, match="finite"):
        mine(np.array([1.0, np.nan, 2.0, 3.0]), np.arange(4.0))
