"""MIC on the smallest samples it scores (minepy's grid bound B = max(n^0.6, 4)) and mine.c's row equipartition."""

from __future__ import annotations

import numpy as np
import pytest

from app.features.mic import _equipartition, mic


@pytest.mark.parametrize("n", [4, 5, 7, 9, 10])
def test_a_perfect_relation_scores_near_one_from_four_points(n: int) -> None:
    """Below n = 11, n^0.6 < 4: the bound of 4 cells still allows the 2 x 2 grid, on which a monotone relation
    scores about 1 (1 up to rounding when n can be halved), not 0."""
    x = np.arange(float(n))
    assert mic(x, x ** 3) > 0.97
    assert mic(x, -x) > 0.97


def test_rows_close_when_adding_a_point_misses_the_row_size_by_as_much_as_stopping() -> None:
    """10 distinct values into 4 rows (2.5 a row): after 2 points, a third would be 0.5 over and stopping is
    0.5 under; mine.c closes the row on that tie (``>=``), giving rows of 2, 3, 2 and 3 points."""
    rows = np.empty(10, dtype=np.int64)
    assert _equipartition(np.arange(10.0), 4, rows) == 4
    assert rows.tolist() == [0, 0, 1, 1, 1, 2, 2, 3, 3, 3]


def test_equal_values_are_never_split_between_rows() -> None:
    rows = np.empty(8, dtype=np.int64)
    d = np.array([1.0, 1.0, 1.0, 2.0, 3.0, 3.0, 3.0, 4.0])
    _equipartition(d, 2, rows)
    assert len(set(rows[:3].tolist())) == 1 and len(set(rows[4:7].tolist())) == 1
