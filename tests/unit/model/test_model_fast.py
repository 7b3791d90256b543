from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest
import xgboost
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from model_samples import synthetic_rtt, train_small

from app.model.base import Predictor
from app.model.errors import UnsupportedModelError
from app.model.fast import FastPredictor
from app.model.forest import forest_from_booster
from app.model.train import booster_to_bytes

RTOL = 1e-4


def assert_same(fast: FastPredictor, booster: xgboost.Booster, X: np.ndarray) -> None:
    got = fast.predict(X)
    want = booster.inplace_predict(X, missing=np.nan).astype(np.float64)
    assert got.dtype == np.float64 and got.shape == (X.shape[0],)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-6 * max(1.0, float(np.abs(want).max(initial=0))))


@pytest.fixture(scope="module")
def fast(small_booster) -> FastPredictor:
    return FastPredictor.from_booster(small_booster)


# around LANES (16) and ROWS_AS_BLOCK (5): tails walked row by row or as one padded block
@pytest.mark.parametrize("n", [1, 2, 4, 5, 7, 8, 9, 15, 16, 17, 20, 21, 31, 63, 64, 65, 512])
def test_equals_inplace_predict_for_every_batch_size(small_booster, fast, n):
    X, _ = synthetic_rtt(n, seed=100 + n, missing=0.2)
    assert_same(fast, small_booster, X)


@pytest.mark.parametrize(
    "objective",
    ["reg:squarederror", "reg:absoluteerror", "reg:pseudohubererror", "reg:gamma", "count:poisson"],
)
def test_other_regression_objectives(objective):
    booster = train_small(objective, depth=3, rounds=6, seed=1)
    X, _ = synthetic_rtt(100, seed=2, missing=0.3)
    assert_same(FastPredictor.from_booster(booster), booster, X)


@pytest.mark.parametrize("depth", [1, 2, 6, 8])
def test_depths_and_missing_heavy_training(depth):
    booster = train_small(depth=depth, rounds=5, seed=depth, missing=0.5)
    X, _ = synthetic_rtt(64, seed=3, missing=0.5)
    fp = FastPredictor.from_booster(booster)
    assert_same(fp, booster, X)
    assert fp.n_trees == 5


def test_trees_that_are_a_single_leaf():
    X, y = synthetic_rtt(100)
    booster = xgboost.train({"max_depth": 3, "min_split_loss": 1e12}, xgboost.DMatrix(X, label=y), 3)
    fp = FastPredictor.from_booster(booster)
    assert int(forest_from_booster(booster).trees[:, 2].max()) == 0
    assert_same(fp, booster, X[:10])


# Values on the split thresholds themselves are where `<` versus `<=` would show.
@pytest.fixture(scope="module")
def thresholds(small_booster) -> list[float]:
    forest = forest_from_booster(small_booster)
    return sorted({float(t) for t in forest.thresholds})


@settings(max_examples=80, deadline=None)
@given(data=st.data(), n=st.integers(1, 80))
def test_hypothesis_random_rows_with_nans_and_exact_thresholds(small_booster, fast, thresholds, data, n):
    value = st.one_of(
        st.floats(-1e6, 1e6, width=32, allow_nan=False),
        st.just(float("nan")),
        st.sampled_from([float("inf"), float("-inf"), -0.0, 0.0, 1e-45, -1e-45, 3.4e38, -3.4e38]),
        st.sampled_from(thresholds),
        st.sampled_from(thresholds).map(lambda t: float(np.nextafter(np.float32(t), np.float32(-np.inf)))),
    )
    X = data.draw(hnp.arrays(np.float32, (n, 6), elements=value))
    assert_same(fast, small_booster, X)


def test_same_rows_give_the_same_answer_in_any_batch(small_booster, fast):
    X, _ = synthetic_rtt(40, seed=11, missing=0.3)
    whole = fast.predict(X)
    one_by_one = np.concatenate([fast.predict(X[i:i + 1]) for i in range(len(X))])
    np.testing.assert_allclose(one_by_one, whole, rtol=1e-12)  # block walk and row walk agree
    assert np.array_equal(fast.predict(X[::-1])[::-1], whole)


@pytest.mark.parametrize("fmt", ["ubj", "json"])
def test_from_bytes_equals_from_booster(small_booster, fast, fmt):
    other = FastPredictor.from_bytes(booster_to_bytes(small_booster, fmt))
    X, _ = synthetic_rtt(40, seed=9)
    assert np.array_equal(other.predict(X), fast.predict(X))


def test_feature_names_and_the_predictor_protocol(small_booster, fast):
    p: Predictor = fast
    assert p.feature_names == tuple(small_booster.feature_names)
    renamed = FastPredictor.from_booster(small_booster, [f"x{i}" for i in range(6)])
    assert renamed.feature_names[0] == "x0"
    X, y = synthetic_rtt(50)
    anonymous = xgboost.train({"max_depth": 2}, xgboost.DMatrix(X, label=y), 2)
    assert FastPredictor.from_booster(anonymous).feature_names == tuple(f"f{i}" for i in range(6))
    with pytest.raises(UnsupportedModelError, match="feature names"):
        FastPredictor.from_booster(small_booster, ["only", "two"])


def test_wrong_shapes_are_refused(fast):
    with pytest.raises(ValueError, match=r"shape \(n, 6\)"):
        fast.predict(np.zeros((3, 5), dtype=np.float32))
    with pytest.raises(ValueError, match=r"shape \(n, 6\)"):
        fast.predict(np.zeros(6, dtype=np.float32))
    assert fast.predict(np.zeros((0, 6), dtype=np.float32)).shape == (0,)


def test_float64_input_is_read_as_float32_like_xgboost(small_booster, fast):
    X, _ = synthetic_rtt(30, seed=4)
    assert_same(fast, small_booster, X.astype(np.float64))


@pytest.mark.parametrize(
    "params",
    [
        {"objective": "binary:logistic"},
        {"objective": "multi:softprob", "num_class": 3},
        {"objective": "reg:squarederror", "booster": "dart"},
        {"objective": "reg:squarederror", "booster": "gblinear"},
    ],
)
def test_unsupported_boosters_are_refused_clearly(params):
    X, y = synthetic_rtt(60)
    label = (y > np.median(y)).astype(float) if params["objective"] != "reg:squarederror" else y
    if params.get("num_class"):
        label = np.digitize(y, np.percentile(y, [33, 66])).astype(float)
    booster = xgboost.train(params, xgboost.DMatrix(X, label=label), 2)
    with pytest.raises(UnsupportedModelError):
        FastPredictor.from_booster(booster)


def test_threads_share_one_predictor(small_booster, fast):
    X, _ = synthetic_rtt(64, seed=5)
    want = fast.predict(X)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: fast.predict(X), range(16)))
    assert all(np.array_equal(r, want) for r in results)


def test_a_row_predicts_the_same_number_wherever_it_stands(small_booster):
    X, _ = synthetic_rtt(21, seed=7, missing=0.2)  # 16 rows in a block, 5 in a padded block
    together = FastPredictor.from_booster(small_booster).predict(X)
    alone = FastPredictor.from_booster(small_booster)  # one row at a time: the row-by-row path
    assert np.array_equal(together, np.concatenate([alone.predict(X[i:i + 1]) for i in range(len(X))]))


def test_remembered_and_repeated_rows_give_the_walked_numbers(small_booster, monkeypatch):
    X, _ = synthetic_rtt(40, seed=8, missing=0.3)
    want = FastPredictor.from_booster(small_booster).predict(X)
    fp = FastPredictor.from_booster(small_booster)
    fp.predict(X[:10])
    mixed = np.vstack([X[5:25], X[5:25], X[30:]])  # remembered, repeated within the call, new
    assert np.array_equal(fp.predict(mixed), np.concatenate([want[5:25], want[5:25], want[30:]]))
    fp.forget()
    fp.predict(X[10:20])
    new_first = np.vstack([X[:3], X[10:20], X[:3]])  # a new first row: every row walked, remembered ones too
    assert np.array_equal(fp.predict(new_first), np.concatenate([want[:3], want[10:20], want[:3]]))
    assert fp.remembered == 13
    monkeypatch.setattr("app.model.fast.MEMO_ROWS", 8)  # full: starts afresh, same numbers
    assert np.array_equal(fp.predict(X), want)
    assert np.array_equal(fp.predict(X[::-1]), want[::-1])
    assert fp.predict(X[:0]).shape == (0,)


def test_each_distinct_row_is_remembered_once(small_booster, monkeypatch):
    X, _ = synthetic_rtt(30, seed=9, missing=0.3)
    fp = FastPredictor.from_booster(small_booster)
    assert fp.remembered == 0  # the warm-up row is forgotten
    want = fp.predict(X)
    assert fp.remembered == 30
    negative_zero = X[:3].copy()
    negative_zero[:, 0] = -0.0  # another row bit for bit, the same prediction as 0.0
    zero = negative_zero.copy()
    zero[:, 0] = 0.0
    repeats = np.vstack([X[:5], X[:5], X[3:8], zero, negative_zero])
    got = fp.predict(repeats)
    assert np.array_equal(got[:15], np.concatenate([want[:5], want[:5], want[3:8]]))
    assert np.array_equal(got[15:18], got[18:])
    assert fp.remembered == 33  # 0.0 and -0.0: one key (the same path through every tree)
    fp.forget()
    assert fp.remembered == 0 and np.array_equal(fp.predict(X[::-1]), want[::-1])
    monkeypatch.setattr("app.model.fast.MEMO_ROWS", 8)
    assert np.array_equal(fp.predict(X), want) and fp.remembered == 30  # nothing new: nothing changes
    assert np.array_equal(fp.predict(X[:4] + 1), fp.predict(X[:4] + 1)) and fp.remembered == 4  # afresh
    assert np.array_equal(fp.predict(X[::-1]), want[::-1]) and fp.remembered == 8  # afresh, 8 of the 30 kept


def test_rows_not_to_remember_give_the_same_numbers_and_leave_the_memory_as_it_was(small_booster):
    X, _ = synthetic_rtt(40, seed=10, missing=0.3)
    want = FastPredictor.from_booster(small_booster).predict(X)
    fp = FastPredictor.from_booster(small_booster)
    assert np.array_equal(fp.predict(X[:20], remember=False), want[:20]) and fp.remembered == 0
    fp.predict(X[:10])  # filter: remembered
    mixed = np.vstack([X[:10], X[20:30]])  # prioritize: the remembered rows first, then new ones
    assert np.array_equal(fp.predict(mixed, remember=False), np.concatenate([want[:10], want[20:30]]))
    assert fp.remembered == 10
    assert np.array_equal(fp.predict(X[30:], remember=False), want[30:]) and fp.remembered == 10


@pytest.fixture(scope="module")
def task_booster() -> xgboost.Booster:
    """Trained on node features and the task's input size (the last column), as the scheduler's models are."""
    X, y = synthetic_rtt(400, n_features=4, seed=11, missing=0.1)
    size = np.random.default_rng(12).uniform(10, 900, size=len(X)).astype(np.float32)
    X = np.column_stack([X, size]).astype(np.float32)
    names = [f"m{i}__mean" for i in range(4)] + ["task_input_size_mb"]
    return xgboost.train({"max_depth": 4, "tree_method": "hist", "max_bin": 64, "seed": 0, "nthread": 1},
                         xgboost.DMatrix(X, label=y + 0.3 * size, feature_names=names), 20)


def _input_thresholds(fp: FastPredictor) -> np.ndarray:
    forest = fp._forest
    column = forest.feature_names.index("task_input_size_mb")
    return np.unique(forest.thresholds[(forest.codes >> 1) == column])


def test_the_task_input_is_keyed_by_its_cell_the_rest_by_value(task_booster):
    fp = FastPredictor.from_booster(task_booster)
    cuts = _input_thresholds(fp)
    assert cuts.size > 3
    sizes = np.concatenate([cuts, np.nextafter(cuts, np.float32(np.inf)), np.nextafter(cuts, np.float32(-np.inf)),
                            [0.0, 5000.0, np.nan]]).astype(np.float32)
    X = np.zeros((sizes.size, 5), dtype=np.float32)
    X[:, 0] = np.arange(sizes.size)  # every row another value of a node feature: keyed by value
    X[:, 4] = sizes
    rows = fp.memo_rows(X)
    want = np.searchsorted(cuts, sizes, side="right")  # thresholds at or below the value: x >= t goes right
    want[np.isnan(sizes)] = -1
    np.testing.assert_array_equal(rows[:, 4], want)
    np.testing.assert_array_equal(rows[:, 0], X[:, 0].view(np.int32))  # float keys of non-negative values: the bits
    X[:, 0] = np.nan
    assert (fp.memo_rows(X)[:, 0] == np.iinfo(np.int32).min).all()  # NaN: one key


@settings(max_examples=40, deadline=None)
@given(sizes=hnp.arrays(np.float32, st.integers(1, 60), elements=st.floats(0, 1000, width=32)), seed=st.integers(0, 50))
def test_rows_in_one_cell_share_a_memory_row_and_predict_what_a_walk_gives(task_booster, sizes, seed):
    fp = FastPredictor.from_booster(task_booster)
    node = synthetic_rtt(3, n_features=4, seed=seed)[0]
    X = np.column_stack([np.repeat(node, sizes.size, axis=0), np.tile(sizes, 3)]).astype(np.float32)
    first = fp.predict(X)
    np.testing.assert_array_equal(first, fp._walk(X))  # bit for bit what walking each row gives
    assert_same(fp, task_booster, X)
    cells = np.searchsorted(_input_thresholds(fp), sizes, side="right")
    distinct = len({(r, c) for r in range(3) for c in cells.tolist()})
    assert fp.remembered == fp.walked == distinct  # one walk and one memory row per node and cell
    np.testing.assert_array_equal(fp.predict(X[::-1]), first[::-1])
    assert fp.walked == distinct  # all found


def test_the_table_grows_keeps_what_it_holds_and_starts_afresh_when_full(small_booster, monkeypatch):
    X, _ = synthetic_rtt(3000, seed=13, missing=0.2)
    fp = FastPredictor.from_booster(small_booster)
    want = fp._walk(X)
    for part in np.array_split(np.arange(len(X)), 7):  # the table doubles several times along the way
        np.testing.assert_array_equal(fp.predict(X[part]), want[part])
    assert fp.remembered == fp.walked == len(np.unique(fp.memo_rows(X), axis=0))
    np.testing.assert_array_equal(fp.predict(X[::-1]), want[::-1])
    assert fp.walked == fp.remembered  # nothing walked again after the growths
    monkeypatch.setattr("app.model.fast.MEMO_ROWS", 100)
    np.testing.assert_array_equal(fp.predict(X[:50] + 7), fp._walk(X[:50] + 7))  # full: afresh, then these
    assert fp.remembered == 50
    np.testing.assert_array_equal(fp.predict(X[100:400] + 7), fp._walk(X[100:400] + 7))  # more than it holds
    assert fp.remembered == 100  # the first 100 of them
    np.testing.assert_array_equal(fp.predict(X[:2]), want[:2])
