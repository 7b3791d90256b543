"""score_nodes: hand-computed scores, bad numbers, and the properties the extender relies on."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.scheduler.scoring import MAX_SCORE, NEUTRAL_SCORE, blended_scores, raw_scores, score_nodes

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize(("rtt", "cred", "want"), [
    ([100.0, 200.0, 1000.0, 300.0], [1.0, 1.0, 1.0, 1.0], [10, 5, 1, 3]),  # 10 * 100 / 300 = 3.33
    ([100.0, 400.0, 125.0], [1.0, 1.0, 1.0], [10, 2, 8]),  # 2.5 rounds to even; 8.0 stays
    ([100.0, 200.0, 1000.0], [0.5, 0.5, 0.5], [8, 5, 3]),  # 7.5 -> 8, 5, 3.0
    ([100.0, 300.0], [0.25, 0.75], [6, 4]),  # 0.25*10 + 3.75 = 6.25; 0.75*3.33 + 1.25 = 3.75
    ([100.0, 200.0], [0.0, 0.0], [5, 5]),  # never right: neutral
    ([50.0, 200.0, 200.0], [1.0, 2.0, -1.0], [10, 2, 5]),  # credibility clamped to [0, 1]
    ([50.0, 100.0], [NAN, 1.0], [5, 5]),  # unknown credibility counts as 0
    ([NAN, INF, -INF, 0.0, -5.0, 50.0], [1.0] * 6, [5, 5, 5, 5, 5, 10]),  # unusable predictions: neutral
    ([NAN, 0.0], [1.0, 1.0], [5, 5]),  # nothing usable at all
    ([1e-300, 1e300], [1.0, 1.0], [10, 0]),  # extremes stay finite and in range
    ([], [], []),
])
def test_hand_computed_scores(rtt: list[float], cred: list[float], want: list[int]) -> None:
    got = score_nodes(rtt, cred)
    assert got.dtype == np.int64 and got.tolist() == want


def test_raw_and_blended_scores() -> None:
    raw = raw_scores(np.array([100.0, 400.0, NAN, 0.0]))
    assert raw[:2].tolist() == [10.0, 2.5] and np.isnan(raw[2:]).all()
    assert blended_scores([100.0, 400.0, NAN], [0.5, 0.5, 1.0]).tolist() == [7.5, 3.75, 5.0]
    assert raw_scores(np.array([INF, NAN])).tolist() == pytest.approx([NAN, NAN], nan_ok=True)


rtts = st.lists(st.one_of(st.floats(0.01, 1e6), st.sampled_from([100.0, 200.0, NAN, 0.0, -1.0, INF])),
                min_size=1, max_size=16)


@settings(max_examples=200)
@given(rtts.flatmap(lambda r: st.tuples(st.just(r), st.lists(
    st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, 0.5, 1.0])), min_size=len(r), max_size=len(r)))))
def test_properties(case: tuple[list[float], list[float]]) -> None:
    rtt, cred = np.array(case[0]), np.array(case[1])
    score, blended = score_nodes(rtt, cred), blended_scores(rtt, cred)
    assert ((score >= 0) & (score <= MAX_SCORE)).all()
    assert (np.abs(score - blended) <= 0.5).all()
    usable = np.isfinite(rtt) & (rtt > 0)
    assert (score[~usable] == NEUTRAL_SCORE).all()
    if not usable.any():
        return
    best = rtt[usable].min()
    fully = usable & (cred == 1.0)
    assert np.allclose(blended[fully], MAX_SCORE * best / rtt[fully])  # the fastest 10, twice as slow 5
    assert (blended[usable & (cred == 0.0)] == NEUTRAL_SCORE).all()
    for i in np.flatnonzero(usable):
        # credibility pulls toward neutral: between the speed's score and 5
        raw = MAX_SCORE * best / rtt[i]
        assert min(raw, NEUTRAL_SCORE) - 1e-9 <= blended[i] <= max(raw, NEUTRAL_SCORE) + 1e-9
        for j in np.flatnonzero(usable):
            if cred[i] == cred[j] and rtt[i] < rtt[j]:
                assert score[i] >= score[j]
            if rtt[i] == rtt[j] and cred[i] > cred[j]:
                assert abs(blended[i] - NEUTRAL_SCORE) >= abs(blended[j] - NEUTRAL_SCORE) - 1e-9
    # a request's scores depend on the candidates' relative speed only, and not on their order
    assert score_nodes(rtt * 8.0, cred).tolist() == score.tolist()
    perm = np.random.default_rng(0).permutation(rtt.size)
    assert score_nodes(rtt[perm], cred[perm]).tolist() == score[perm].tolist()


floats = st.floats(allow_nan=True, allow_infinity=True, width=64)


@given(st.lists(st.tuples(floats, floats), max_size=12))
def test_integer_scores_are_the_rounded_blended_scores(pairs: list[tuple[float, float]]) -> None:
    """score_nodes takes fewer array passes than rint(blended_scores(...)) and gives the same integers."""
    rtt = np.array([p[0] for p in pairs], dtype=np.float64)
    cred = np.array([p[1] for p in pairs], dtype=np.float64)
    with np.errstate(all="ignore"):
        expected = np.rint(blended_scores(rtt, cred)).astype(np.int64)
    assert score_nodes(rtt, cred).tolist() == expected.tolist()


def test_rtts_near_the_largest_float_still_score_within_0_and_10() -> None:
    """10 x the fastest RTT overflowed to inf: inf / inf and 0 x inf made NaN, cast to a huge negative score."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow, no invalid value, no NaN cast
        scores = score_nodes([1.7e308, 1.79e308, math.nan], [0.0, 1.0, 1.0]).tolist()
        assert scores == [5, 9, 5]
        assert np.rint(blended_scores([1.7e308, 1.79e308], [0.0, 1.0])).tolist() == [5.0, 9.0]


@given(st.lists(st.tuples(st.one_of(st.floats(1e-6, 1e9), st.floats(1e-300, 1.7e308)), st.floats(0.0, 1.0)),
                min_size=1, max_size=64))
def test_every_usable_candidate_takes_the_same_arithmetic(pairs: list[tuple[float, float]]) -> None:
    """The case of every request with fresh predictions (no NaN, credibility in [0, 1]): same integers."""
    rtt = np.array([p[0] for p in pairs], dtype=np.float64)
    cred = np.array([p[1] for p in pairs], dtype=np.float64)
    with np.errstate(all="ignore"):  # 10 x the fastest RTT may overflow when it is near the largest float
        expected = np.rint(blended_scores(rtt, cred)).astype(np.int64)
        got = score_nodes(rtt, cred).tolist()
        assert score_nodes(rtt.tolist(), cred.tolist()).tolist() == got
    assert got == expected.tolist()
