"""Map predicted RTTs of the candidate nodes to kube-scheduler extender scores (0..10).

The rule, per request (one pod, N candidates):

1. ``raw_i = MAX_SCORE * best / rtt_i`` where ``best`` is the lowest finite predicted RTT among the
   candidates. Monotone: a lower predicted RTT never scores lower. The fastest node gets 10, a node twice as
   slow 5, ten times as slow 1.
2. Credibility pulls toward neutral: ``score_i = c_i * raw_i + (1 - c_i) * NEUTRAL_SCORE``, with
   ``c_i`` clamped to [0, 1]. A node whose predictions have never been right (c = 0) scores neutral.
   Scores stay monotone in the predicted RTT among nodes of equal credibility only: a fast node of low
   credibility can score below a slower, credible one (that is the point of the pull).
3. A node without a usable prediction (NaN, inf, <= 0) scores neutral. Scores are rounded to integers
   and clamped to [0, 10]. Nothing here raises on bad numbers.

>>> score_nodes([100.0, 200.0, 1000.0], [1.0, 1.0, 1.0]).tolist()
[10, 5, 1]
>>> score_nodes([100.0, 200.0], [1.0, 0.0]).tolist()
[10, 5]
>>> score_nodes([float("nan"), 50.0], [1.0, 1.0]).tolist()
[5, 10]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MAX_SCORE = 10  # k8s.io/kube-scheduler/extender/v1 MaxExtenderPriority
MIN_SCORE = 0
NEUTRAL_SCORE = 5


def raw_scores(rtt_ms: Sequence[float] | np.ndarray) -> np.ndarray:
    """Float scores in [0, 10] before credibility (the best node's ``10 x best / best`` may be 10 + 2e-15: callers
    clamp or round); NaN where the prediction is unusable."""
    rtt = np.asarray(rtt_ms, dtype=np.float64)
    ok = np.isfinite(rtt) & (rtt > 0)
    if not ok.any():
        return np.full(rtt.shape, np.nan)
    return np.where(ok, _ratio(rtt[ok].min(), np.where(ok, rtt, 1.0)), np.nan)


def _ratio(best: float, rtt: np.ndarray) -> np.ndarray:
    """``MAX_SCORE * best / rtt``; with ``best`` near the largest float, the ratio first (it is at most 1) so
    that ``MAX_SCORE * best`` cannot overflow to inf (and a NaN score)."""
    scale = MAX_SCORE * float(best)  # a Python float: inf without a warning
    if scale < np.inf:
        return scale / rtt
    return MAX_SCORE * (best / rtt)


def blended_scores(rtt_ms: Sequence[float] | np.ndarray, credibility: Sequence[float] | np.ndarray) -> np.ndarray:
    """Float scores in [0, 10] after the credibility pull toward neutral (no rounding)."""
    raw = raw_scores(rtt_ms)
    c = np.asarray(credibility, dtype=np.float64)
    c = np.clip(np.where(np.isnan(c), 0.0, c), 0.0, 1.0)
    ok = ~np.isnan(raw)
    blended = np.where(ok, c * raw + (1.0 - c) * NEUTRAL_SCORE, NEUTRAL_SCORE)  # c x NaN: NaN, no warning
    # never below 0 (c and 1 - c in [0, 1], raw >= 0); above 10 by a rounding: 10 x best / best can be 10 + 2e-15
    return np.minimum(blended, MAX_SCORE)


def score_nodes(rtt_ms: Sequence[float] | np.ndarray, credibility: Sequence[float] | np.ndarray) -> np.ndarray:
    """Integer extender scores (0..10) for candidates with predicted RTTs and credibilities.

    The same numbers as ``rint(blended_scores(...))``, with fewer array passes (it runs on every request).
    """
    rtt = np.asarray(rtt_ms, dtype=np.float64)
    cred = np.asarray(credibility, dtype=np.float64)
    if rtt.size:
        lo = rtt.min()
        # every prediction usable and every credibility in [0, 1] (a NaN fails each test), and MAX_SCORE * lo
        # finite: the same arithmetic without the masks and clamps (the blend of a score in (0, 10] and 5
        # cannot leave [0, 10])
        if 0 < lo < 1e300 and rtt.max() < np.inf and cred.min() >= 0.0 and cred.max() <= 1.0:
            return np.rint(cred * (MAX_SCORE * lo / rtt) + (1.0 - cred) * NEUTRAL_SCORE).astype(np.int64)
    out = np.full(rtt.shape, NEUTRAL_SCORE, dtype=np.int64)
    ok = np.isfinite(rtt) & (rtt > 0)  # NaN > 0 is False, without a warning
    if not ok.any():
        return out
    r = rtt[ok]
    c = cred[ok]
    c = np.clip(np.where(np.isnan(c), 0.0, c), 0.0, 1.0)
    blended = c * _ratio(r.min(), r) + (1.0 - c) * NEUTRAL_SCORE
    out[ok] = np.rint(blended)  # blended in [0, 10 + 2e-15] (c in [0, 1], ratio in (0, 10]): rint in 0..10
    return out
