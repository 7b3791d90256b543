"""A champion is judged on the holdout rows it cannot have fitted: those after the last row of its fit set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.registry.directory import DirectoryModelStore
from app.sim.policies.training import Champion, SimulatedTrainer
from app.trainer.champion import judge
from app.trainer.history import Dataset
from app.trainer.pipeline import (
    JUDGED_AFTER,
    MIN_UNSEEN,
    judge_challenger,
    score,
    score_champion,
    train_challenger,
    unseen,
)
from app.trainer.registry import ModelRegistry

FAST = {"n_estimators": 40}
FIT_END = 359.0  # the champion fitted every row up to here: half of the challenger's holdout (rows 320–399)


def dataset(n: int = 400, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 100, n)
    X = np.column_stack([x, np.arange(n)]).astype(np.float32)
    return Dataset(X, 100.0 + 4.0 * x + rng.normal(0, 10, n), np.arange(n, dtype=np.float64), ("util__mean", "row"))


class Recalling:
    """A champion that recalls the RTT of every row it fitted (rows up to ``FIT_END``) and is ``off`` ms wrong on
    any other: a model that fits its training rows far better than new ones, as boosted trees do."""

    feature_names = ("row",)

    def __init__(self, truth: np.ndarray, off: float) -> None:
        self.truth, self.off = truth, off

    def predict(self, X: np.ndarray, remember: bool = True) -> np.ndarray:
        rows = X[:, 0].astype(int)
        sign = np.where(rows % 2 == 0, 1.0, -1.0)
        return np.where(rows <= FIT_END, self.truth[rows], self.truth[rows] + sign * self.off)


@pytest.fixture(scope="module")
def case() -> tuple[Dataset, object, Recalling]:
    ds = dataset()
    challenger = train_challenger(ds, "cpu", params=FAST, selector=None)
    after = unseen(challenger.holdout, FIT_END)
    assert len(after) == 40 and after.ts[0] == FIT_END + 1
    # 25 % worse than the challenger on the rows it never saw
    champion = Recalling(ds.y, 1.25 * challenger.score(after)["rmse_ms"])
    return ds, challenger, champion


def test_a_champion_that_recalls_its_fit_rows_no_longer_wins_on_them(case) -> None:
    """On the whole holdout the champion's recalled rows hide that it is worse on new ones (the verdict the
    trainer gave before); judged on the rows after its fit set, the better challenger is promoted."""
    _, challenger, champion = case
    mixed = score_champion(champion, challenger.holdout)
    assert JUDGED_AFTER not in mixed and mixed["n"] == 80
    assert judge(challenger.metrics, mixed).reason == "not_better"  # what rows it fitted bought the champion
    fair = score_champion(champion, challenger.holdout, FIT_END)
    assert fair["n"] == 40 and fair[JUDGED_AFTER] == FIT_END
    verdict = judge_challenger(challenger, fair)
    assert verdict.reason == "better" and verdict.promote
    assert verdict.champion_rmse_ms == pytest.approx(1.25 * verdict.challenger_rmse_ms)
    assert verdict.challenger_rmse_ms != pytest.approx(challenger.metrics["rmse_ms"])  # rescored on the 40 rows


def test_too_few_rows_after_the_fit_set_judge_on_the_whole_holdout(case) -> None:
    _, challenger, champion = case
    late = float(challenger.holdout.ts[-MIN_UNSEEN])  # MIN_UNSEEN - 1 rows after it
    assert unseen(challenger.holdout, late) is challenger.holdout
    assert unseen(challenger.holdout, late - 1.0).ts.tolist() == challenger.holdout.ts[-MIN_UNSEEN:].tolist()
    assert unseen(challenger.holdout, None) is challenger.holdout
    assert unseen(challenger.holdout, 0.0) is challenger.holdout  # every row is after it: nothing cut
    whole = score_champion(champion, challenger.holdout, late)
    assert JUDGED_AFTER not in whole and judge_challenger(challenger, whole) == judge(challenger.metrics, whole)


def test_the_registry_judges_on_the_rows_after_the_records_training_window(tmp_path: Path) -> None:
    registry = ModelRegistry(store=DirectoryModelStore(tmp_path / "models"))
    first = train_challenger(dataset(200), "cpu", params=FAST, selector=None)
    registry.register("gCTF:cpu", first)
    window = registry.store.current("gCTF:cpu").training_window  # type: ignore[union-attr]
    assert window == (0.0, 159.0)
    later = train_challenger(dataset(300, seed=1), "cpu", params=FAST, selector=None)  # holdout: rows 240–299
    holdout = Dataset(later.holdout.X, later.holdout.y, later.holdout.ts - 100.0, later.holdout.names)  # 140–199
    champ = registry.champion_metrics("gCTF:cpu", holdout)
    assert champ is not None and champ["n"] == 40 and champ[JUDGED_AFTER] == 159.0
    predict = first.result.booster.inplace_predict
    assert champ["rmse_ms"] == pytest.approx(score(predict, first.selected, holdout.rows(20))["rmse_ms"], rel=1e-4)


def test_the_simulated_trainer_judges_its_champion_likewise(case) -> None:
    ds, challenger, champion = case
    trainer = SimulatedTrainer(delay_s=0.0, params=FAST, selector=None, background=False)
    try:
        assert trainer.submit("gCTF:cpu", "growth", 0.0, ds, Champion(champion, FIT_END))
        (done,) = trainer.ready(0.0)
    finally:
        trainer.close()
    assert done.verdict is not None and done.verdict.reason == "better"
    assert done.verdict.challenger_rmse_ms == pytest.approx(challenger.score(unseen(challenger.holdout,
                                                                                    FIT_END))["rmse_ms"])
