"""bench/bench_learning.py's PredictTimer: what the models' predictions alone cost the simulation thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import xgboost
from bench_learning import PredictTimer

from app.model.fast import FastPredictor


@pytest.fixture(scope="module")
def predictor() -> FastPredictor:
    X = np.arange(40, dtype=np.float32).reshape(20, 2)
    return FastPredictor.from_booster(xgboost.train({"max_depth": 2}, xgboost.DMatrix(X, label=X[:, 0] + 1), 4))


def test_it_counts_rows_asked_and_rows_walked_apart(predictor: FastPredictor) -> None:
    X = np.array([[1, 2], [3, 4], [5, 6]], dtype=np.float32)
    predictor.forget()
    with PredictTimer() as w:
        first = predictor.predict(X)
        again = predictor.predict(X)  # every row remembered: none walked
        mixed = predictor.predict(np.vstack([X, [[7, 8]]]).astype(np.float32))  # one new row walked
    assert (w.rows, w.walked, w.calls) == (10, 4, 3)
    assert w.seconds > 0
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(mixed[:3], first)


def test_calls_in_other_threads_are_left_out_and_the_method_is_restored(predictor: FastPredictor) -> None:
    original = FastPredictor.predict
    X = np.ones((6, 2), dtype=np.float32)
    with PredictTimer() as w:
        t = threading.Thread(target=predictor.predict, args=(X,), kwargs={"remember": False})
        t.start()
        t.join()
        assert (w.rows, w.calls) == (0, 0)
        predictor.predict(X[:2], remember=False)
    assert (w.rows, w.walked, w.calls) == (2, 1, 1)  # two equal rows: one walk
    assert FastPredictor.predict is original
    with pytest.raises(RuntimeError), PredictTimer():
        raise RuntimeError("a failed run")
    assert FastPredictor.predict is original
