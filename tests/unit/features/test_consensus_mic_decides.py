"""consensus() skips MIC only when its vote cannot change the choice, whatever the other features look like."""

from __future__ import annotations

import numpy as np

from app.features.selection import SelectionRule, consensus, select_features


def test_a_lone_feature_one_vote_short_is_decided_by_mic() -> None:
    """A non-monotone relation gets dcor's vote only among the cheap measures; with two votes needed MIC's
    vote decides, even when no other feature (noise with no vote at all) is there to make MIC be measured."""
    rng = np.random.default_rng(8)
    x = rng.uniform(-1, 1, 400)
    target = x ** 2 + rng.normal(scale=0.05, size=400)
    rule = SelectionRule(min_votes=2)
    X = x[:, None]
    assert select_features(X, target, ["sq"], rule).chosen == ("sq",)
    assert consensus(X, target, ["sq"], rule) == ("sq",)


def test_two_features_one_vote_short_and_one_clearly_in() -> None:
    """The linear feature has four cheap votes, the quadratic one dcor's only: with three votes needed, MIC
    cannot lift the quadratic one; with two it does."""
    rng = np.random.default_rng(9)
    x = rng.uniform(-1, 1, 400)
    z = rng.uniform(-1, 1, 400)
    target = 3 * z + 4 * x ** 2 + rng.normal(scale=0.05, size=400)
    X = np.column_stack([z, x])
    for rule in (SelectionRule(min_votes=2), SelectionRule(min_votes=3)):
        assert consensus(X, target, ["lin", "sq"], rule) == select_features(X, target, ["lin", "sq"], rule).chosen


def test_mic_alone_chooses_as_select_features_does() -> None:
    """A rule of MIC only: no cheap measure to count first, MIC decides every feature."""
    rng = np.random.default_rng(8)
    x = rng.uniform(-1, 1, 300)
    X = np.column_stack([x, rng.normal(size=300)])
    target = x ** 2 + rng.normal(scale=0.05, size=300)
    rule = SelectionRule(measures=("mic",), thresholds={}, min_votes=1)
    assert select_features(X, target, ["sq", "noise"], rule).chosen == ("sq",)
    assert consensus(X, target, ["sq", "noise"], rule) == ("sq",)
