"""score_nodes, blended_scores and raw_scores: the rules the hand-computed cases of test_sched_scoring.py leave
open — credibility above 1 with no negative credibility beside it, the fastest node's 10 when ``10 x best /
best`` rounds above 10, and predictions or credibilities given as float32 (XGBoost's output type)."""

from __future__ import annotations

import numpy as np

from app.scheduler.scoring import blended_scores, raw_scores, score_nodes


def test_credibility_above_1_counts_as_1() -> None:
    # 125 ms against the fastest 100: 8 at full credibility; 1.5 unclamped would give 1.5 * 8 - 0.5 * 5 = 9.5
    assert score_nodes([100.0, 125.0], [1.0, 1.5]).tolist() == [10, 8]
    assert blended_scores([100.0, 125.0], [1.0, 1.5]).tolist() == [10.0, 8.0]


def test_the_fastest_node_at_full_credibility_scores_exactly_10() -> None:
    # 10 * 0.237 / 0.237 is 10.000000000000002 in doubles: the blended score is still within [0, 10]
    assert raw_scores(np.array([0.237, 0.474]))[0] > 10.0
    assert blended_scores([0.237, 0.474], [1.0, 1.0])[0] == 10.0
    assert score_nodes([0.237, 0.474], [1.0, 1.0]).tolist() == [10, 5]


def test_float32_predictions_score_as_their_values() -> None:
    # float32(100.1) = 100.0999985: 10 x 100.0999985 / 182 = 5.49999992 in doubles, 5.5 (rounded to 6) in float32
    rtt32 = np.array([100.1, 182.0], dtype=np.float32)
    rtt64 = rtt32.astype(np.float64)
    assert score_nodes(rtt32, [1.0, 1.0]).tolist() == score_nodes(rtt64, [1.0, 1.0]).tolist() == [10, 5]
    assert raw_scores(rtt32).tolist() == raw_scores(rtt64).tolist()
    assert raw_scores(rtt32)[1] < 5.5
    unusable = np.array([np.nan, 100.1, 182.0], dtype=np.float32)  # the path with masks gives the same
    assert score_nodes(unusable, [1.0] * 3).tolist() == [5, 10, 5]


def test_float32_credibilities_score_as_their_values() -> None:
    # float32(0.30000004) = 0.3000000417: 5 + 5 x 0.3000000417 = 6.5000002 -> 7; in float32 arithmetic 6.5 -> 6
    cred32 = np.array([0.30000004, 1.0], dtype=np.float32)
    cred64 = cred32.astype(np.float64)
    assert score_nodes([100.0, 200.0], cred32).tolist() == score_nodes([100.0, 200.0], cred64).tolist() == [7, 5]
    assert blended_scores([100.0, 200.0], cred32).tolist() == blended_scores([100.0, 200.0], cred64).tolist()
    assert blended_scores([100.0, 200.0], cred32)[0] > 6.5
