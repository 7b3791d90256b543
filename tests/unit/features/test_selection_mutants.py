"""Consensus selection at its edges: top-k ties, MIC alone in consensus(), the report's placeholders, the
ends of the one-scale readings and the errors a caller sees."""

from __future__ import annotations

import numpy as np
import pytest

from app.features import selection
from app.features.measures import MEASURES, MeasureTable
from app.features.selection import SelectionRule, consensus, gaussian_rho, render_table, select_features


def use_strengths(monkeypatch: pytest.MonkeyPatch, strengths: dict[str, list[float]],
                  degenerate: tuple[str, ...] = (), n_used: int = 100) -> list[tuple[str, ...]]:
    """select_features and consensus see these strengths (per feature, in the order of MEASURES); the votes
    are the real ones. Returns the list of the measure sets asked for."""
    asked: list[tuple[str, ...]] = []

    def table(X, y, names, measures):
        asked.append(tuple(measures))
        strength = np.array([[strengths[n][MEASURES.index(m)] for m in measures] for n in names]).reshape(
            len(names), len(measures))
        return MeasureTable(tuple(names), tuple(measures), strength, strength, np.full(len(names), n_used),
                            degenerate, dict.fromkeys(measures, 0.0))

    monkeypatch.setattr(selection, "measure_table", table)
    return asked


def run(names, rule: SelectionRule):
    return select_features(np.zeros((100, len(names))), np.zeros(100), names, rule)


def test_top_k_ties_go_to_the_earlier_column(monkeypatch: pytest.MonkeyPatch) -> None:
    """f5 is the strongest on every measure; f0..f4 tie. With top_k = 3 each measure votes for f5 and the
    first two of the tied columns, f0 and f1, whatever the sort would do with equal values."""
    names = [f"f{i}" for i in range(6)]
    use_strengths(monkeypatch, {**{n: [0.5] * 5 for n in names[:5]}, "f5": [0.9] * 5})
    res = run(names, SelectionRule(top_k=3, min_votes=1))
    assert dict(res.votes) == {"f0": 5, "f1": 5, "f2": 0, "f3": 0, "f4": 0, "f5": 5}
    assert res.chosen == ("f5", "f0", "f1")
    reordered = ["f5", "f3", "f4", "f2", "f1", "f0"]  # the tie follows the columns' order, not the names
    assert run(reordered, SelectionRule(top_k=3, min_votes=1)).chosen == ("f5", "f3", "f4")


def test_consensus_rejects_duplicate_names_in_one_line() -> None:
    with pytest.raises(ValueError) as err:
        consensus(np.zeros((10, 2)), np.arange(10.0), ["a", "a"])
    assert str(err.value) == "names: must be distinct"


def test_consensus_with_mic_alone_measures_it_and_chooses_what_it_votes_for(monkeypatch) -> None:
    """MIC as the only measure (min_votes is then 1): every feature is one vote short without it."""
    strengths = {"hi": [0.0, 0.0, 0.0, 0.0, 0.6], "lo": [0.9, 0.9, 0.9, 0.9, 0.1], "mid": [0.0, 0.0, 0.0, 0.0, 0.3]}
    asked = use_strengths(monkeypatch, strengths)
    names = ["lo", "mid", "hi"]
    rule = SelectionRule(measures=("mic",), min_votes=1)  # MIC's threshold at n = 100: 0.285
    assert consensus(np.zeros((100, 3)), np.zeros(100), names, rule) == ("mid", "hi")
    assert ("mic",) in asked
    assert run(names, rule).chosen == ("hi", "mid")  # select_features: by strength; consensus: by name order
    fixed = SelectionRule(measures=("mic",), thresholds={"mic": 0.5}, min_votes=1)
    assert consensus(np.zeros((100, 3)), np.zeros(100), names, fixed) == ("hi",)


def test_consensus_with_mic_alone_on_real_data() -> None:
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, 200)
    X = np.column_stack([x, rng.normal(size=200), np.ones(200)])
    y = x ** 2 + rng.normal(scale=0.05, size=200)
    rule = SelectionRule(measures=("mic",), min_votes=1)
    assert consensus(X, y, ["sq", "noise", "flat"], rule) == ("sq",) == select_features(
        X, y, ["sq", "noise", "flat"], rule).chosen


def test_report_marks_a_chosen_feature_no_measure_relates_to_and_lists_every_degenerate_one(monkeypatch) -> None:
    """With every threshold at 0 a feature whose strengths are all 0 is chosen; its strongest measure is none,
    shown as '-'. The degenerate columns are listed, comma-separated."""
    use_strengths(monkeypatch, {"a": [0.5, 0.4, 0.3, 0.4, 0.6], "z": [0.0] * 5, "c1": [0.0] * 5,
                                "c2": [0.0] * 5}, degenerate=("c1", "c2"))
    res = run(["a", "z", "c1", "c2"], SelectionRule(thresholds=dict.fromkeys(MEASURES, 0.0)))
    assert res.chosen == ("a", "z") and res.strongest["z"] is None
    assert render_table(res) == "\n".join([
        "feature  pearson spearman  kendall     dcor      mic votes  strongest",
        "a          0.500    0.400    0.300    0.400    0.600     5  mic",
        "z          0.000    0.000    0.000    0.000    0.000     5  -",
        "degenerate (constant or < 4 samples, scored 0): c1, c2",
    ])
    assert render_table(res, limit=1).splitlines()[1:] == [
        "a          0.500    0.400    0.300    0.400    0.600     5  mic",
        "degenerate (constant or < 4 samples, scored 0): c1, c2"]


def test_a_perfect_distance_correlation_reads_rho_one_exactly() -> None:
    """The closed form at rho = 1 is 1 (its rounding, 7e-16 over, is cut off), so dcor 1 is |rho| 1, as
    Pearson 1 is."""
    assert float(selection._dcor_of_gaussian(np.array([1.0]))[0]) == 1.0
    assert gaussian_rho("dcor", 1.0) == 1.0 == gaussian_rho("pearson", 1.0)
    assert float(selection._dcor_of_gaussian(np.array([0.0]))[0]) == 0.0 == gaussian_rho("dcor", 0.0)
