"""Consensus selection, its rule, Table-1 shares, the report renderers and ``rttsched select``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.cli.main import main
from app.contracts import encode
from app.features import measures, selection
from app.features.measures import MEASURES, MeasureTable
from app.features.selection import (
    DEFAULT_THRESHOLDS,
    SelectionRule,
    gaussian_rho,
    mic_null_level,
    mic_threshold,
    render_shares,
    render_table,
    select_features,
    strongest_share,
)

INFORMATIVE = ("lin", "exp", "step")


def synthetic(seed: int = 42, n: int = 500) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """3 informative columns (linear, monotone-convex, smooth step), 10 noise columns, 1 constant."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 14))
    X[:, 13] = 4.2
    y = 1.5 * X[:, 0] + np.exp(X[:, 1]) + 2.5 * np.tanh(3 * X[:, 2]) + rng.normal(scale=0.5, size=n)
    return X, y, [*INFORMATIVE, *(f"noise{i}" for i in range(10)), "flat"]


@pytest.fixture(scope="module")
def result():
    X, y, names = synthetic()
    return select_features(X, y, names)


def test_picks_exactly_the_informative_features(result) -> None:
    assert set(result.chosen) == set(INFORMATIVE)
    assert result.degenerate == ("flat",)
    assert result.votes["flat"] == 0 and result.strongest["flat"] is None
    assert all(result.votes[f"noise{i}"] < 3 for i in range(10))


def test_chosen_are_ordered_by_total_strength(result) -> None:
    totals = [sum(result.scores[n].values()) for n in result.chosen]
    assert totals == sorted(totals, reverse=True)
    assert result.ranking[: len(result.chosen)] == result.chosen and "flat" not in result.ranking


# Hand-made strengths (features x pearson, spearman, kendall, dcor, mic) against the default thresholds
# 0.3, 0.3, 0.2, 0.27 and MIC's at n = 100, 0.285. "b" sits exactly on three thresholds; "e" is degenerate;
# "f" passes every threshold but MIC's (0.26 < 0.285).
HAND = {
    "a": [0.90, 0.90, 0.80, 0.85, 0.70],  # 5 votes, total 4.15
    "b": [0.30, 0.29, 0.20, 0.27, 0.10],  # pearson, kendall, dcor: 3 votes, total 1.16
    "c": [0.10, 0.10, 0.05, 0.50, 0.60],  # dcor, mic: 2 votes, total 1.35
    "d": [0.50, 0.60, 0.40, 0.10, 0.20],  # pearson, spearman, kendall: 3 votes, total 1.80
    "e": [0.00, 0.00, 0.00, 0.00, 0.00],  # degenerate
    "f": [0.31, 0.31, 0.21, 0.28, 0.26],  # 4 votes (not MIC), total 1.37
}


@pytest.fixture
def hand_table(monkeypatch):
    """select_features on the strengths above: the measures are replaced, the vote is the real one."""
    names = list(HAND)

    def table(X, y, names, measures):
        strength = np.array([[HAND[n][MEASURES.index(m)] for m in measures] for n in names])
        return MeasureTable(tuple(names), tuple(measures), strength, strength, np.full(len(names), 100), ("e",),
                            dict.fromkeys(measures, 0.0))

    monkeypatch.setattr(selection, "measure_table", table)
    return lambda rule: select_features(np.zeros((100, len(names))), np.zeros(100), names, rule)


@pytest.mark.parametrize(("rule", "votes", "chosen"), [
    (SelectionRule(), {"a": 5, "b": 3, "c": 2, "d": 3, "e": 0, "f": 4}, ("a", "d", "f", "b")),
    (SelectionRule(min_votes=5), {"a": 5, "b": 3, "c": 2, "d": 3, "e": 0, "f": 4}, ("a",)),
    (SelectionRule(min_votes=1), {"a": 5, "b": 3, "c": 2, "d": 3, "e": 0, "f": 4}, ("a", "d", "f", "c", "b")),
    # top 2 per measure: pearson, spearman, kendall pick a, d; dcor and mic pick a, c
    (SelectionRule(top_k=2), {"a": 5, "b": 0, "c": 2, "d": 3, "e": 0, "f": 0}, ("a", "d")),
    (SelectionRule(top_k=2, min_votes=2), {"a": 5, "b": 0, "c": 2, "d": 3, "e": 0, "f": 0}, ("a", "d", "c")),
    (SelectionRule(top_k=1, min_votes=1), {"a": 5, "b": 0, "c": 0, "d": 0, "e": 0, "f": 0}, ("a",)),
    # a threshold of 0 passes every strength, but never the degenerate column
    (SelectionRule(thresholds=dict.fromkeys(MEASURES, 0.0)), {"a": 5, "b": 5, "c": 5, "d": 5, "e": 0, "f": 5},
     ("a", "d", "f", "c", "b")),
    (SelectionRule(measures=("dcor", "mic"), thresholds={"dcor": 0.27, "mic": 0.25}, min_votes=2),
     {"a": 2, "b": 1, "c": 2, "d": 0, "e": 0, "f": 2}, ("a", "c", "f")),
])
def test_hand_computed_votes_and_choices(hand_table, rule: SelectionRule, votes: dict[str, int],
                                         chosen: tuple[str, ...]) -> None:
    res = hand_table(rule)
    assert dict(res.votes) == votes and res.n_samples == 100
    assert res.chosen == chosen
    assert res.degenerate == ("e",) and "e" not in res.ranking and len(res.ranking) == 5


def test_hand_computed_strongest_measure(hand_table) -> None:
    """On one scale (the |rho| of a normal pair that gives the value): a reads 0.9 on Pearson, 0.91 on
    Spearman (2 sin(0.9 pi / 6)), 0.95 on Kendall (sin(0.8 pi / 2)); c is seen by MIC and dcor only."""
    res = hand_table(SelectionRule())
    assert res.strongest["a"] == "kendall" and res.strongest["c"] == "mic" and res.strongest["e"] is None
    assert res.strongest["d"] == "spearman"  # 2 sin(0.6 pi / 6) = 0.618 > 0.5, sin(0.4 pi / 2) = 0.588


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), top_k=st.integers(1, 4))
def test_a_stricter_rule_chooses_a_subset(seed: int, top_k: int) -> None:
    X, y, names = synthetic(seed, n=120)
    loose = select_features(X, y, names, SelectionRule(min_votes=1))
    for rule in (SelectionRule(min_votes=3), SelectionRule(min_votes=1, top_k=top_k)):
        strict = select_features(X, y, names, rule)
        assert set(strict.chosen) <= set(loose.chosen)
        assert all(strict.votes[n] <= loose.votes[n] for n in names)
    capped = select_features(X, y, names, SelectionRule(min_votes=1, top_k=top_k))
    assert sum(capped.votes.values()) <= top_k * len(MEASURES)


def test_a_non_monotone_feature_is_found_by_dcor_and_mic_only() -> None:
    rng = np.random.default_rng(8)
    x = rng.uniform(-1, 1, 800)
    X = np.column_stack([x, rng.normal(size=800)])
    res = select_features(X, x ** 2 + rng.normal(scale=0.05, size=800), ["sq", "noise"], SelectionRule(min_votes=2))
    assert res.votes["sq"] == 2 and res.chosen == ("sq",)
    assert res.strongest["sq"] in ("dcor", "mic")


def test_gaussian_rho_puts_each_measure_on_one_scale() -> None:
    rho = 0.6  # population values of a bivariate normal pair with this correlation
    values = {"pearson": rho, "spearman": 6 / np.pi * np.arcsin(rho / 2), "kendall": 2 / np.pi * np.arcsin(rho)}
    for m, v in values.items():
        assert gaussian_rho(m, v) == pytest.approx(rho, abs=1e-9)
    assert gaussian_rho("dcor", 0.0) == 0.0 and gaussian_rho("dcor", 1.0) == pytest.approx(1.0)
    assert gaussian_rho("mic", 0.1, n=1000) == 0.0  # below the null level of independent data


def test_strongest_share_is_table_one(result) -> None:
    shares = strongest_share({"gCTF": result, "upload": result})
    assert set(shares) == {"gCTF", "upload"}
    assert sum(shares["gCTF"].values()) == pytest.approx(100.0)
    counted = [result.strongest[n] for n in result.chosen]
    assert shares["gCTF"]["mic"] == pytest.approx(100.0 * counted.count("mic") / len(counted))
    assert sum(strongest_share({"a": result}, over="all")["a"].values()) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="over"):
        strongest_share({"a": result}, over="some")


def test_json_and_text_reports(result) -> None:
    doc = json.loads(result.to_json())
    assert doc["chosen"] == list(result.chosen) and doc["degenerate"] == ["flat"]
    assert doc["features"]["lin"]["votes"] == result.votes["lin"]
    assert doc["rule"]["thresholds"] == {**DEFAULT_THRESHOLDS, "mic": "mic_threshold(n)"}
    text = render_table(result, title="== app")
    assert text.splitlines()[0] == "== app"
    assert all(n in text for n in result.chosen) and "degenerate" in text and "flat" in text
    assert "100.0%" in render_shares({"x": {"mic": 100.0, "dcor": 0.0}})


@pytest.mark.parametrize("kwargs, field", [
    ({"min_votes": 0}, "min_votes"), ({"min_votes": 6}, "min_votes"), ({"top_k": 0}, "top_k"),
    ({"thresholds": {**DEFAULT_THRESHOLDS, "mic": 1.5}}, "thresholds.mic"),
    ({"thresholds": {"pearson": 0.3}}, "thresholds.spearman"), ({"measures": ("pearson", "cosine")}, "measures"),
])
def test_rule_rejects_bad_settings_naming_the_field(kwargs, field) -> None:
    with pytest.raises(ValueError, match=field):
        SelectionRule(**kwargs)


def test_mic_threshold_follows_the_null_level_at_the_sample_size() -> None:
    """MIC votes at the value a |rho| = 0.3 normal pair reads at n: above the null level, falling with n."""
    sizes = [50, 100, 300, 1000, 3000]
    levels = [mic_threshold(n) for n in sizes]
    assert levels == sorted(levels, reverse=True)
    assert all(t > mic_null_level(n) for t, n in zip(levels, sizes, strict=True))
    assert all(gaussian_rho("mic", t, n) == pytest.approx(0.3, abs=1e-9) for t, n in zip(levels, sizes, strict=True))
    assert SelectionRule().threshold("mic", 100) == pytest.approx(mic_threshold(100))
    assert SelectionRule(thresholds={**DEFAULT_THRESHOLDS, "mic": 0.4}).threshold("mic", 100) == 0.4


def test_mic_rarely_votes_for_independent_noise() -> None:
    """Pure-noise columns at n = 100 (3 seeds x 40 columns): a fixed 0.25 gave MIC's vote to 35 of 120
    (measured), the null-based threshold to 9; at n = 400 to 2 of 120."""
    def votes(n: int, rule: SelectionRule) -> int:
        total = 0
        for seed in range(3):
            rng = np.random.default_rng(11 + seed)
            X, y = rng.normal(size=(n, 40)), rng.normal(size=n)
            total += len(select_features(X, y, [f"x{j}" for j in range(40)], rule).chosen)
        return total

    auto = SelectionRule(min_votes=1, measures=("mic",))
    fixed = SelectionRule(thresholds={"mic": 0.25}, min_votes=1, measures=("mic",))
    assert votes(100, auto) <= 0.1 * 120 and votes(400, auto) <= 0.05 * 120
    assert votes(100, fixed) > 3 * votes(100, auto)


def test_duplicate_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="^names: must be distinct$"):
        select_features(np.zeros((10, 2)), np.arange(10.0), ["a", "a"])


# --- rttsched select


def _write_csv(path: Path) -> None:
    X, y, names = synthetic(n=300)
    lines = ["app,node," + ",".join(names) + ",rtt_ms"]
    for app in ("gCTF", "upload"):
        lines += [f"{app},w1," + ",".join(f"{v:.6g}" for v in row) + f",{t:.6g}" for row, t in zip(X, y, strict=True)]
    path.write_text("\n".join(lines) + "\n")


def test_cli_csv_prints_tables_and_writes_json(tmp_path: Path, capsys) -> None:
    src, out = tmp_path / "samples.csv", tmp_path / "report.json"
    _write_csv(src)
    assert main(["select", "--input", str(src), "--json", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "== gCTF" in stdout and "== upload" in stdout and "strongest measure per app" in stdout
    report = json.loads(out.read_text())
    assert set(report["apps"]["gCTF"]["chosen"]) == set(INFORMATIVE)
    assert set(report["strongest_share"]) == {"gCTF", "upload"}


def test_cli_jsonl_of_training_samples(tmp_path: Path, capsys) -> None:
    X, y, names = synthetic(n=200)
    src = tmp_path / "samples.jsonl"
    with src.open("wb") as fh:
        for i, (row, rtt) in enumerate(zip(X, y, strict=True)):
            msg = {"model_key": "gCTF:gpu", "task_id": f"t{i}", "app": "gCTF", "node": "w1", "node_class": "gpu",
                   "started_ts": 1.7e9 + i, "rtt_ms": float(rtt) + 10.0, "predicted_rtt_ms": float(rtt) + 10.0,
                   "features": dict(zip(names, map(float, row), strict=True))}
            fh.write(encode("training-samples", msg) + b"\n")
    assert main(["select", "--input", str(src), "--min-votes", "4", "--threshold", "mic=0.3"]) == 0
    stdout = capsys.readouterr().out
    assert "lin" in stdout and "predicted_rtt_ms" not in stdout and "started_ts" not in stdout


@pytest.mark.parametrize("argv_tail, message", [
    (["--target", "latency"], "no column 'latency'"),
    (["--app-column", "tenant"], "no column 'tenant'"),
    (["--min-votes", "9"], "min_votes"),
    (["--threshold", "mic"], "MEASURE=VALUE"),
])
def test_cli_errors_are_one_line(tmp_path: Path, capsys, argv_tail, message) -> None:
    src = tmp_path / "samples.csv"
    _write_csv(src)
    assert main(["select", "--input", str(src), *argv_tail]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("rttsched select: error:") and message in err[-1] and "Traceback" not in "".join(err)


def test_cli_missing_and_malformed_files(tmp_path: Path, capsys) -> None:
    assert main(["select", "--input", str(tmp_path / "none.csv")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"app": "x"}\n')
    assert main(["select", "--input", str(bad)]) == 2
    assert "bad.jsonl:1: not a training-samples message" in capsys.readouterr().err


@pytest.mark.parametrize("rho", [0.0, 0.3, 0.6, 0.9, 1.0])
def test_dcor_of_a_normal_pair_matches_a_simulated_one(rho: float) -> None:
    """The closed form (Szekely, Rizzo & Bakirov 2007, Theorem 7) against 20,000 simulated pairs."""
    from app.features.dcor_fast import distance_correlation
    from app.features.selection import _dcor_of_gaussian

    rng = np.random.default_rng(int(rho * 10))
    x = rng.normal(size=20_000)
    y = rho * x + np.sqrt(1 - rho**2) * rng.normal(size=20_000)
    closed = float(_dcor_of_gaussian(np.array([rho]))[0])
    assert closed == pytest.approx(distance_correlation(x, y), abs=0.02)
    assert gaussian_rho("dcor", closed) == pytest.approx(rho, abs=1e-3)


def test_mic_scale_inverts_the_documented_model() -> None:
    """MIC of a normal pair: m0 + (1 - m0) (1 - sqrt(1 - rho^2)), m0 the null level (0.944 n^-0.288)."""
    assert mic_null_level(100) == pytest.approx(0.2506, abs=1e-4)
    assert mic_null_level(1000) == pytest.approx(0.1291, abs=1e-4)
    assert mic_null_level(0) == mic_null_level(1) == 0.944 and mic_null_level(10**9) < 0.003
    for n in (100, 1000):
        m0 = mic_null_level(n)
        for rho in (0.2, 0.5, 0.8, 1.0):
            assert gaussian_rho("mic", m0 + (1 - m0) * (1 - np.sqrt(1 - rho**2)), n) == pytest.approx(rho, abs=1e-9)
        assert gaussian_rho("mic", m0 / 2, n) == 0.0
    assert gaussian_rho("mic", 0.5) == gaussian_rho("mic", 0.5, 1000) != gaussian_rho("mic", 0.5, 999)


def test_strengths_outside_the_unit_interval_are_clamped() -> None:
    for m in MEASURES:
        assert gaussian_rho(m, 1.7) == gaussian_rho(m, 1.0) and gaussian_rho(m, -0.2) == gaussian_rho(m, 0.0)


def test_hand_computed_report(hand_table) -> None:
    res = hand_table(SelectionRule(top_k=2))
    assert render_table(res) == "\n".join([
        "feature  pearson spearman  kendall     dcor      mic votes  strongest",
        "a          0.900    0.900    0.800    0.850    0.700     5  kendall",
        "d          0.500    0.600    0.400    0.100    0.200     3  spearman",
        "degenerate (constant or < 4 samples, scored 0): e",
    ])
    none = hand_table(SelectionRule(thresholds=dict.fromkeys(MEASURES, 1.0)))
    assert render_table(none, title="== x").splitlines()[:3] == [
        "== x", "feature  pearson spearman  kendall     dcor      mic votes  strongest", "(no feature has 3 votes)"]
    assert strongest_share({"x": none}) == {"x": dict.fromkeys(MEASURES, 0.0)}  # nothing chosen: no shares
    assert render_shares({"gCTF": {"mic": 75.0, "dcor": 25.0}, "upload": {"dcor": 100.0}}) == "\n".join([
        "app         mic     dcor", "gCTF      75.0%    25.0%", "upload     0.0%   100.0%"])


def test_strongest_measure_reads_mic_at_the_sample_size_used(monkeypatch) -> None:
    """MIC 0.5 is |rho| 0.75 at 100 samples (null level 0.25) but 0.82 at 1,000 (0.13): Pearson's 0.78 wins
    only at 100. The vote uses the rows each column kept, not a fixed size."""
    strength = np.array([[0.78, 0.1, 0.05, 0.1, 0.5]])
    for n_used, winner in ((100, "pearson"), (1000, "mic")):
        table = MeasureTable(("g",), MEASURES, strength, strength, np.array([n_used]), (), dict.fromkeys(MEASURES, 0.0))
        monkeypatch.setattr(selection, "measure_table", lambda X, y, names, measures, t=table: t)
        assert select_features(np.zeros((n_used, 1)), np.zeros(n_used), ["g"]).strongest["g"] == winner


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), min_votes=st.integers(1, 5), top_k=st.sampled_from([None, 1, 2, 4]),
       n=st.sampled_from([40, 120]), weak=st.floats(0.0, 1.5))
def test_consensus_chooses_what_select_features_chooses(seed: int, min_votes: int, top_k: int | None, n: int,
                                                        weak: float) -> None:
    """The same choice, in the order of the names, whether or not MIC had to be measured."""
    rng = np.random.default_rng(seed)
    X, y, names = synthetic(seed, n=n)
    X[:, 4] = y * weak + rng.normal(size=n)  # a column anywhere from noise to a strong relation
    X[rng.random(n) < 0.2, 5] = np.nan
    rule = SelectionRule(min_votes=min_votes, top_k=top_k)
    chosen = set(select_features(X, y, names, rule).chosen)
    assert selection.consensus(X, y, names, rule) == tuple(n for n in names if n in chosen)


def test_consensus_measures_mic_only_when_its_vote_can_change_the_choice(monkeypatch) -> None:
    calls: list[int] = []
    mic = measures._KERNELS["mic"]

    def counted(x: np.ndarray, y: np.ndarray) -> float:
        calls.append(x.size)
        return mic(x, y)

    monkeypatch.setitem(measures._KERNELS, "mic", counted)
    rng = np.random.default_rng(8)
    x = rng.uniform(-1, 1, 400)
    clear = np.column_stack([x, rng.normal(size=400)])  # linear: four votes; noise: none
    assert selection.consensus(clear, 3 * x + rng.normal(scale=0.1, size=400), ["lin", "noise"]) == ("lin",)
    assert calls == []
    # a non-monotone relation: dcor votes, Pearson/Spearman/Kendall do not, so with two votes needed MIC decides
    sq = np.column_stack([x, rng.normal(size=400)])
    target = x ** 2 + rng.normal(scale=0.05, size=400)
    assert selection.consensus(sq, target, ["sq", "noise"], SelectionRule(min_votes=2)) == ("sq",)
    assert len(calls) == 2  # every column's MIC (its top-k ranks them all)
    calls.clear()
    assert selection.consensus(sq, target, ["sq", "noise"], SelectionRule(min_votes=2, measures=MEASURES[:4])) == ()
    assert calls == []
