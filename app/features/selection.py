"""Consensus feature selection: a feature enters the initial set when enough of the five measures vote for it.

A measure *votes* for a feature when the feature's strength reaches that measure's threshold and, if
``top_k`` is set, the feature is among that measure's ``top_k`` strongest. Degenerate columns
(:mod:`app.features.measures`) never get a vote. A feature with at least ``min_votes`` votes is chosen;
chosen features are ordered by their total strength over the measures.

The default thresholds sit at each measure's value for a moderate association, a bivariate normal pair
with ``|rho| = 0.3`` (:data:`MODERATE_RHO`): Pearson and Spearman 0.3, Kendall's tau 0.2 (``2/pi * arcsin(0.3)
= 0.19``), distance correlation 0.27 (its value at ``rho = 0.3``). MIC has no fixed value there: independent
data already score 0.25 at n = 100 and 0.13 at n = 1,000 (:func:`mic_null_level`), so its threshold is taken
at each feature's sample size from that null level (:func:`mic_threshold`: 0.29 at n = 100, 0.21 at 400,
0.17 at 1,000) unless the rule fixes one. See docs/feature-selection.md.

*Strongest measure* of a feature: the measure that sees the association as strongest once every measure is
put on one scale, the ``|rho|`` of a bivariate normal pair that would give the same value
(:func:`gaussian_rho`). A plain linear-Gaussian relation then reads about the same on all five, a monotone
but curved one reads higher on Spearman/Kendall, a non-monotone one higher on dcor/MIC. (Dividing by the
thresholds instead would favour Kendall on every strong linear relation, since ``tau`` grows faster than
``rho``.) Ties go to the earlier measure in :data:`~app.features.measures.MEASURES`. :func:`strongest_share`
counts, per app, how often each measure was the strongest over the chosen features (the seed's Table 1).
:meth:`SelectionResult.to_json`, :func:`render_table` and :func:`render_shares` produce the report.

>>> import numpy as np
>>> rng = np.random.default_rng(7)
>>> y = rng.normal(size=300)
>>> X = np.column_stack([y + rng.normal(scale=0.3, size=300), rng.normal(size=300), np.ones(300)])
>>> res = select_features(X, y, ["load", "noise", "flat"])
>>> res.chosen, res.votes["load"], res.degenerate
(('load',), 5, ('flat',))
"""

from __future__ import annotations

import dataclasses
import json
import types
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from app.features.measures import MEASURES, MeasureTable, measure_table

MODERATE_RHO = 0.3  # the association every default threshold stands for (bivariate normal |rho|)
DEFAULT_THRESHOLDS: Mapping[str, float] = types.MappingProxyType(
    {"pearson": 0.3, "spearman": 0.3, "kendall": 0.2, "dcor": 0.27}
)  # no "mic": its threshold follows the sample size (mic_threshold)


def mic_null_level(n: int) -> float:
    """Mean MIC of two independent normal samples of size ``n`` (fitted: 0.25 at 100, 0.13 at 1,000).

    >>> round(mic_null_level(1000), 3)
    0.129
    """
    return 0.944 * max(n, 1) ** -0.288  # at most 0.944 (n = 1)


def mic_threshold(n: int, rho: float = MODERATE_RHO) -> float:
    """MIC of a bivariate normal pair with ``|rho|`` at ``n`` samples: ``m0 + (1 - m0)(1 - sqrt(1 - rho^2))``.

    ``m0`` is :func:`mic_null_level`; the curve is the one :func:`gaussian_rho` inverts. The default vote
    threshold of MIC, so that MIC, like the other four measures, votes for an association of about
    ``|rho| = 0.3`` whatever the sample size, and not for noise at small ones.

    >>> [round(mic_threshold(n), 3) for n in (100, 400, 1000, 2000)]
    [0.285, 0.206, 0.169, 0.147]
    """
    m0 = mic_null_level(n)
    return m0 + (1.0 - m0) * (1.0 - float(np.sqrt(1.0 - rho * rho)))


@dataclasses.dataclass(frozen=True)
class SelectionRule:
    """How the five measures vote.

    Parameters
    ----------
    thresholds:
        Minimum strength (0..1) for a measure's vote; every measure of ``measures`` but ``mic`` must have one.
        Without a ``mic`` entry, MIC's threshold is :func:`mic_threshold` at each feature's sample size.
    top_k:
        When set, a measure votes only for its ``top_k`` strongest features (that also pass the threshold);
        of features with equal strengths, the earlier columns of ``X`` come first.
    min_votes:
        Votes a feature needs to be chosen, 1..len(measures).
    measures:
        The measures that vote.
    """

    thresholds: Mapping[str, float] = dataclasses.field(default_factory=lambda: dict(DEFAULT_THRESHOLDS))
    top_k: int | None = None
    min_votes: int = 3
    measures: tuple[str, ...] = MEASURES

    def __post_init__(self) -> None:
        if not self.measures or len(set(self.measures)) != len(self.measures):
            raise ValueError(f"measures: must be distinct and non-empty (got {self.measures})")
        unknown = [m for m in self.measures if m not in MEASURES]
        if unknown:
            raise ValueError(f"measures: unknown {unknown} (known: {', '.join(MEASURES)})")
        for m in self.measures:
            t = self.thresholds.get(m)
            if t is None:
                if m == "mic":
                    continue
                raise ValueError(f"thresholds.{m}: missing")
            if not 0.0 <= float(t) <= 1.0:
                raise ValueError(f"thresholds.{m}: must be between 0 and 1 (got {t})")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k: must be >= 1 or None (got {self.top_k})")
        if not 1 <= self.min_votes <= len(self.measures):
            raise ValueError(f"min_votes: must be between 1 and {len(self.measures)} (got {self.min_votes})")
        frozen = types.MappingProxyType({m: float(self.thresholds[m]) for m in self.measures if m in self.thresholds})
        object.__setattr__(self, "thresholds", frozen)

    def threshold(self, measure: str, n: int) -> float:
        """The strength ``measure`` must reach to vote for a feature with ``n`` usable samples.

        >>> rule = SelectionRule()
        >>> rule.threshold("pearson", 100), round(rule.threshold("mic", 100), 3), round(rule.threshold("mic", 1000), 3)
        (0.3, 0.285, 0.169)
        """
        fixed = self.thresholds.get(measure)
        return fixed if fixed is not None else mic_threshold(n)

    def to_dict(self) -> dict[str, Any]:
        thresholds: dict[str, Any] = dict(self.thresholds)
        if "mic" in self.measures and "mic" not in thresholds:
            thresholds["mic"] = "mic_threshold(n)"
        return {"thresholds": thresholds, "top_k": self.top_k, "min_votes": self.min_votes,
                "measures": list(self.measures)}


@dataclasses.dataclass(frozen=True)
class SelectionResult:
    """Outcome of :func:`select_features`; every mapping is keyed by feature name.

    ``scores[name][measure]`` is the strength in [0, 1], ``signed`` the signed value; ``strongest`` is None
    for a feature no measure relates to at all (all strengths 0). ``ranking`` lists every non-degenerate
    feature by total strength, for callers that need a fallback when too few are chosen.
    """

    chosen: tuple[str, ...]
    scores: Mapping[str, Mapping[str, float]]
    signed: Mapping[str, Mapping[str, float]]
    votes: Mapping[str, int]
    strongest: Mapping[str, str | None]
    degenerate: tuple[str, ...]
    ranking: tuple[str, ...]
    n_samples: int
    rule: SelectionRule

    def to_dict(self) -> dict[str, Any]:
        return {
            "chosen": list(self.chosen), "degenerate": list(self.degenerate), "ranking": list(self.ranking),
            "n_samples": self.n_samples, "rule": self.rule.to_dict(),
            "features": {
                name: {"scores": dict(self.scores[name]), "signed": dict(self.signed[name]),
                       "votes": self.votes[name], "strongest": self.strongest[name]}
                for name in self.scores
            },
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)


def _votes(table: MeasureTable, rule: SelectionRule) -> np.ndarray:
    """Boolean (features × measures): which measure votes for which feature."""
    thresholds = np.array([[rule.threshold(m, int(n)) for m in table.measures] for n in table.n_used])
    ok = table.strength >= thresholds.reshape(len(table.names), len(table.measures))
    ok[[i for i, n in enumerate(table.names) if n in set(table.degenerate)], :] = False
    if rule.top_k is not None:
        for j in range(len(table.measures)):
            order = np.argsort(-table.strength[:, j], kind="stable")
            ok[order[rule.top_k:], j] = False
    return ok


_RHO_GRID = np.linspace(0.0, 1.0, 2001)


def _dcor_of_gaussian(rho: np.ndarray) -> np.ndarray:
    """Distance correlation of a bivariate normal pair (Szekely, Rizzo & Bakirov 2007, Theorem 7)."""
    num = rho * np.arcsin(rho) + np.sqrt(1 - rho**2) - rho * np.arcsin(rho / 2) - np.sqrt(4 - rho**2) + 1
    return np.sqrt(np.minimum(num / (1 + np.pi / 3 - np.sqrt(3)), 1.0))  # 1 + 7e-16 at rho = 1; never below 0


_DCOR_GRID = _dcor_of_gaussian(_RHO_GRID)


def gaussian_rho(measure: str, strength: float, n: int = 1000) -> float:
    """The ``|rho|`` of a bivariate normal pair of ``n`` samples on which ``measure`` would read ``strength``.

    Pearson is itself; Spearman ``2 sin(pi s / 6)``; Kendall ``sin(pi t / 2)``; distance correlation by
    inverting its closed form. MIC has no closed form and a strong small-sample bias; on simulated normal
    pairs (n = 100..2,000) it follows ``m0 + (1 - m0) (1 - sqrt(1 - rho^2))`` within a few hundredths, with
    ``m0`` = :func:`mic_null_level`, which is inverted here.

    >>> [round(gaussian_rho(m, v), 3) for m, v in
    ...  [("pearson", 0.3), ("spearman", 0.2875), ("kendall", 0.194), ("dcor", 0.269), ("mic", 0.2)]]
    [0.3, 0.3, 0.3, 0.3, 0.395]
    """
    v = min(max(float(strength), 0.0), 1.0)
    if measure == "spearman":
        return float(2.0 * np.sin(np.pi * v / 6.0))  # at most 2 sin(pi / 6), which rounds below 1
    if measure == "kendall":
        return float(np.sin(np.pi * v / 2.0))
    if measure == "dcor":
        return float(np.interp(v, _DCOR_GRID, _RHO_GRID))
    if measure == "mic":
        m0 = mic_null_level(n)
        h = max(v - m0, 0.0) / (1.0 - m0)
        return float(np.sqrt(1.0 - (1.0 - h) ** 2))
    return v


def _strongest(strength: np.ndarray, measures: Sequence[str], n: int) -> str | None:
    """The measure with the largest :func:`gaussian_rho` at ``n`` samples; None when every strength is 0.

    >>> _strongest(np.array([0.8, 0.82, 0.62, 0.75, 0.45]), MEASURES, 1000)
    'spearman'
    >>> _strongest(np.array([0.02, 0.03, 0.02, 0.45, 0.9]), MEASURES, 1000)
    'mic'
    >>> _strongest(np.zeros(5), MEASURES, 1000) is None
    True
    """
    if not strength.any():
        return None
    rho = [gaussian_rho(m, v, n) for m, v in zip(measures, strength, strict=True)]
    return measures[int(np.argmax(rho))]


def select_features(X: np.ndarray, y: np.ndarray, names: Sequence[str],
                    rule: SelectionRule = SelectionRule()) -> SelectionResult:  # noqa: B008 - frozen, immutable
    """Score every column of ``X`` against ``y`` with the rule's measures and keep the consensus.

    Parameters
    ----------
    X:
        n_samples × n_features; NaN is missing and dropped pairwise per column.
    y:
        The target (RTT), length n_samples.
    names:
        One distinct name per column of ``X``.
    """
    if len(set(names)) != len(names):
        raise ValueError("names: must be distinct")
    table = measure_table(X, y, list(names), rule.measures)
    ok = _votes(table, rule)
    votes = ok.sum(axis=1)
    total = table.strength.sum(axis=1)
    order = sorted(range(len(names)), key=lambda i: (-total[i], names[i]))
    dead = set(table.degenerate)
    return SelectionResult(
        chosen=tuple(names[i] for i in order if votes[i] >= rule.min_votes),
        scores={n: dict(zip(table.measures, map(float, table.strength[i]), strict=True)) for i, n in enumerate(names)},
        signed={n: dict(zip(table.measures, map(float, table.signed[i]), strict=True)) for i, n in enumerate(names)},
        votes={n: int(votes[i]) for i, n in enumerate(names)},
        strongest={n: _strongest(table.strength[i], table.measures, int(table.n_used[i])) for i, n in enumerate(names)},
        degenerate=table.degenerate,
        ranking=tuple(names[i] for i in order if names[i] not in dead),
        n_samples=int(np.asarray(y).size),
        rule=rule,
    )


def consensus(X: np.ndarray, y: np.ndarray, names: Sequence[str],
              rule: SelectionRule = SelectionRule(), costly: str = "mic") -> tuple[str, ...]:  # noqa: B008
    """The features :func:`select_features` chooses, in the order of ``names``, with ``costly`` measured only
    when its votes can change the choice.

    Each measure votes on its own (its threshold, its own top-k), so a feature is chosen or not whatever
    ``costly`` says unless the other measures give it exactly ``min_votes - 1`` votes. When no feature is in
    that position, ``costly`` (MIC: most of a vote's time, about n^1.8) is not computed at all; otherwise it is
    computed for every column, as its top-k needs. Only the choice is returned (no scores, no strongest
    measure): what a retrain needs (:func:`app.trainer.pipeline.default_selector`).

    >>> rng = np.random.default_rng(7)
    >>> y = rng.normal(size=300)
    >>> X = np.column_stack([y + rng.normal(scale=0.3, size=300), rng.normal(size=300), np.ones(300)])
    >>> consensus(X, y, ["load", "noise", "flat"])
    ('load',)
    """
    if len(set(names)) != len(names):
        raise ValueError("names: must be distinct")
    if costly not in rule.measures:
        chosen = set(select_features(X, y, names, rule).chosen)
        return tuple(n for n in names if n in chosen)
    rest = tuple(m for m in rule.measures if m != costly)  # none: costly alone (min_votes 1) decides every one
    votes = _votes(measure_table(X, y, list(names), rest), rule).sum(axis=1)
    if (votes == rule.min_votes - 1).any():
        votes = votes + _votes(measure_table(X, y, list(names), (costly,)), rule)[:, 0]
    return tuple(n for n, v in zip(names, votes.tolist(), strict=True) if v >= rule.min_votes)


def strongest_share(results_by_app: Mapping[str, SelectionResult],
                    over: str = "chosen") -> dict[str, dict[str, float]]:
    """Per app, the percentage of features whose strongest association came from each measure.

    ``over="chosen"`` counts the chosen features, ``over="all"`` every feature with a strongest measure.
    Each app's row sums to 100 (or is all zeros when nothing counted).
    """
    if over not in ("chosen", "all"):
        raise ValueError(f"over: must be 'chosen' or 'all' (got {over!r})")
    shares: dict[str, dict[str, float]] = {}
    for app, res in results_by_app.items():
        pool = res.chosen if over == "chosen" else tuple(res.scores)
        winners = [res.strongest[n] for n in pool if res.strongest[n] is not None]
        shares[app] = {m: (100.0 * winners.count(m) / len(winners) if winners else 0.0) for m in res.rule.measures}
    return shares


def render_table(result: SelectionResult, title: str = "", limit: int | None = None) -> str:
    """Plain-text table of the chosen features: each measure's signed value, votes and strongest measure."""
    measures = result.rule.measures
    width = max([len("feature"), *(len(n) for n in result.chosen)])
    lines = []
    if title:
        lines.append(title)
    lines.append(f"{'feature':<{width}} " + " ".join(f"{m:>8}" for m in measures) + f" {'votes':>5}  strongest")
    for name in result.chosen[:limit]:
        cells = " ".join(f"{result.signed[name][m]:>8.3f}" for m in measures)
        lines.append(f"{name:<{width}} {cells} {result.votes[name]:>5}  {result.strongest[name] or '-'}")
    if not result.chosen:
        lines.append(f"(no feature has {result.rule.min_votes} votes)")
    if result.degenerate:
        lines.append("degenerate (constant or < 4 samples, scored 0): " + ", ".join(result.degenerate))
    return "\n".join(lines)


def render_shares(shares: Mapping[str, Mapping[str, float]]) -> str:
    """The seed's Table 1 as text: per app, % of chosen features whose strongest measure was each one.

    >>> print(render_shares({"gCTF": {"pearson": 25.0, "mic": 75.0}}))
    app      pearson      mic
    gCTF       25.0%    75.0%
    """
    measures = list(dict.fromkeys(m for row in shares.values() for m in row))
    width = max([len("app"), *(len(a) for a in shares)])
    lines = [f"{'app':<{width}} " + " ".join(f"{m:>8}" for m in measures)]
    for app, row in shares.items():
        lines.append(f"{app:<{width}} " + " ".join(f"{row.get(m, 0.0):>7.1f}%" for m in measures))
    return "\n".join(lines)
