"""score_nodes: the integer scores are the rounded blended scores, for any RTTs and credibilities."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from app.scheduler.scoring import MAX_SCORE, MIN_SCORE, NEUTRAL_SCORE, blended_scores, score_nodes

floats = st.floats(allow_nan=True, allow_infinity=True, width=64)


@given(st.lists(st.tuples(floats, floats), max_size=12))
def test_integer_scores_are_rounded_blended_scores_in_range(pairs: list[tuple[float, float]]) -> None:
    rtt = np.array([p[0] for p in pairs], dtype=np.float64)
    cred = np.array([p[1] for p in pairs], dtype=np.float64)
    with np.errstate(all="ignore"):
        expected = np.rint(blended_scores(rtt, cred)).astype(np.int64)
    got = score_nodes(rtt, cred)
    assert got.tolist() == expected.tolist()
    assert all(MIN_SCORE <= s <= MAX_SCORE for s in got.tolist())
    usable = np.isfinite(rtt) & (rtt > 0)
    assert all(s == NEUTRAL_SCORE for s, ok in zip(got.tolist(), usable.tolist(), strict=True) if not ok)
