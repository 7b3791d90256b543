"""bench/bench_learning.py's WalkTimer: what the tree walks alone cost the simulation thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import xgboost
from bench_learning import WalkTimer

from app.model.fast import FastPredictor


@pytest.fixture(scope="module")
def predictor() -> FastPredictor:
    X = np.arange(40, dtype=np.float32).reshape(20, 2)
    return FastPredictor.from_booster(xgboost.train({"max_depth": 2}, xgboost.DMatrix(X, label=X[:, 0] + 1), 4))


def test_it_counts_the_rows_walked_not_the_rows_remembered(predictor: FastPredictor) -> None:
    X = np.array([[1, 2], [3, 4], [5, 6]], dtype=np.float32)
    predictor.forget()
    with WalkTimer() as w:
        first = predictor.predict(X)
        again = predictor.predict(X)  # every row remembered: no walk
        mixed = predictor.predict(np.vstack([X, [[7, 8]]]).astype(np.float32))  # one new row walked
    assert (w.rows, w.calls) == (4, 2)
    assert w.seconds > 0
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(mixed[:3], first)


def test_walks_in_other_threads_are_left_out_and_the_method_is_restored(predictor: FastPredictor) -> None:
    original = FastPredictor._walk
    X = np.ones((6, 2), dtype=np.float32)
    with WalkTimer() as w:
        t = threading.Thread(target=predictor.predict, args=(X,), kwargs={"remember": False})
        t.start()
        t.join()
        assert (w.rows, w.calls) == (0, 0)
        predictor.predict(X[:2], remember=False)
    assert (w.rows, w.calls) == (2, 1)
    assert FastPredictor._walk is original
    with pytest.raises(RuntimeError), WalkTimer():
        raise RuntimeError("a failed run")
    assert FastPredictor._walk is original
