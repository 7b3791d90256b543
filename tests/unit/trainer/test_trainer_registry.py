"""The trainer's registry side on the real directory store: no champion, a champion scored, a broken one."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from app.config import Settings
from app.contracts import encode
from app.registry.directory import DirectoryModelStore
from app.trainer.champion import judge
from app.trainer.cpus import parse_cpus
from app.trainer.history import Dataset
from app.trainer.pipeline import Challenger, train_challenger
from app.trainer.registry import ModelRegistry
from app.trainer.service import TrainerService

FAST = {"n_estimators": 20}


def dataset(n: int = 200, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 100, n)
    X = np.column_stack([x, rng.normal(size=n)]).astype(np.float32)
    return Dataset(X, 100.0 + 4.0 * x, np.arange(n, dtype=np.float64), ("util__mean", "junk__mean"))


@pytest.fixture
def registry(tmp_path: Path) -> ModelRegistry:
    return ModelRegistry(store=DirectoryModelStore(tmp_path / "models"))


def test_versions_stay_above_the_newest_announced(registry: ModelRegistry) -> None:
    """A registry that lost its data must not hand out a version the consumers already hold (they would
    ignore it as old): a save goes above ``after``; reissue saves the current model again above it."""
    assert registry.reissue("gCTF:cpu", after=7) is None  # nothing current: nothing to reissue
    ch = train_challenger(dataset(), "cpu", params=FAST, selector=None)
    first = registry.register("gCTF:cpu", ch, after=7)
    assert first["version"] == 8
    again = registry.reissue("gCTF:cpu", after=9)
    assert again is not None and again["version"] == 10 and again["sha256"] == first["sha256"]
    assert registry.store.current("gCTF:cpu").version == 10  # type: ignore[union-attr]
    assert registry.register("gCTF:cpu", ch)["version"] == 11  # past what it holds, whatever ``after``


def test_register_then_champion_is_scored_on_the_holdout(registry: ModelRegistry) -> None:
    ch = train_challenger(dataset(), "cpu", params=FAST, selector=None)
    assert registry.champion_metrics("gCTF:cpu", ch.holdout) is None
    msg = registry.register("gCTF:cpu", ch)
    assert msg["version"] == 1 and msg["format"] == "ubj" and msg["features"] == ["util__mean", "junk__mean"]
    encode("model-updates", {**msg, "ts": 1.0, "onset_ts": None})  # satisfies the contract
    champ = registry.champion_metrics("gCTF:cpu", ch.holdout)
    assert champ is not None and champ["rmse_ms"] == pytest.approx(ch.metrics["rmse_ms"], rel=1e-3)
    assert not judge(ch.metrics, champ).promote  # the same model is not 2 % better than itself
    assert registry.store.current("gCTF:cpu").training_window == (0.0, 159.0)


def test_a_broken_champion_counts_as_unusable(registry: ModelRegistry, tmp_path: Path) -> None:
    ch = train_challenger(dataset(), "cpu", params=FAST, selector=None)
    registry.register("gCTF:cpu", ch)
    for blob in (tmp_path / "models").rglob("*.ubj"):
        blob.write_bytes(b"tampered")
    champ = registry.champion_metrics("gCTF:cpu", ch.holdout)
    assert champ is not None and math.isnan(champ["rmse_ms"])
    verdict = judge(ch.metrics, champ)
    assert verdict.reason == "champion_unusable"
    assert registry.judge_again("gCTF:cpu", ch, verdict) is verdict  # the same (broken) current: not judged again


def test_settings_open_the_directory_store(tmp_path: Path) -> None:
    reg = ModelRegistry(Settings.from_env({}, models_dir=str(tmp_path / "m")))
    assert isinstance(reg.store, DirectoryModelStore)
    with pytest.raises(ValueError):
        ModelRegistry()
    with pytest.raises(ValueError):
        ModelRegistry(store=reg.store, fmt="pickle")


def test_cpu_lists_and_service_settings(tmp_path: Path) -> None:
    assert parse_cpus("2-3") == {2, 3} and parse_cpus(" 1 ") == {1}
    for bad in ("", "3-2", "a", "1,-2"):
        with pytest.raises(ValueError):
            parse_cpus(bad)
    s = Settings.from_env({}, models_dir=str(tmp_path))
    with pytest.raises(ValueError):
        TrainerService(s, margin=1.0)
    with pytest.raises(ValueError):
        TrainerService(s, holdout_fraction=0.0)


def good_then_bad(registry: ModelRegistry) -> Challenger:
    """v1 a good model of gCTF:cpu, v2 (current) one trained on shuffled RTTs; the good one."""
    good = train_challenger(dataset(), "cpu", params=FAST, selector=None)
    shuffled = dataset()
    bad = train_challenger(Dataset(shuffled.X, np.random.default_rng(1).permutation(shuffled.y), shuffled.ts,
                                   shuffled.names), "cpu", params=FAST, selector=None)
    registry.register("gCTF:cpu", good)
    registry.register("gCTF:cpu", bad, after=1)
    return good


def test_a_challenger_is_judged_again_against_a_model_rolled_back_to_while_it_trained(
        registry: ModelRegistry) -> None:
    """The challenger beat the bad current model; an operator rolled back to the good one before it was
    registered: it is judged again against the model that serves now, and loses to it."""
    good = good_then_bad(registry)
    challenger = train_challenger(dataset(), "cpu", params=FAST, selector=None)  # as good as v1
    verdict = judge(challenger.metrics, registry.champion_metrics("gCTF:cpu", challenger.holdout))
    assert verdict.reason == "better"
    assert registry.judge_again("gCTF:cpu", challenger, verdict) is verdict  # nothing changed meanwhile

    rolled = registry.restore("gCTF:cpu", 1, after=2)
    assert rolled["version"] == 3 and registry.store.current("gCTF:cpu").restores == 1  # type: ignore[union-attr]
    again = registry.judge_again("gCTF:cpu", challenger, verdict)
    assert again.reason == "not_better" and again.champion_rmse_ms == pytest.approx(good.metrics["rmse_ms"], rel=1e-3)


def test_a_challenger_does_not_replace_a_rollback_that_landed_after_it_was_judged_again(
        registry: ModelRegistry) -> None:
    """The registry's calls in the order of the race: judged against the bad v2 (and again, nothing changed yet),
    then an operator rolls back to v1 while the trainer reads model-updates, then the trainer registers: refused
    by the compare-and-set, judged against the rollback, it loses and saves nothing."""
    good_then_bad(registry)
    challenger = train_challenger(dataset(), "cpu", params=FAST, selector=None)  # as good as v1
    verdict = judge(challenger.metrics, registry.champion_metrics("gCTF:cpu", challenger.holdout))
    assert registry.judge_again("gCTF:cpu", challenger, verdict) is verdict and verdict.reason == "better"
    assert registry.champion_version("gCTF:cpu") == 2

    ModelRegistry(store=registry.store).restore("gCTF:cpu", 1, after=2, replacing=2)  # the operator's rollback
    final, fields = registry.promote_challenger("gCTF:cpu", challenger, verdict)
    assert fields is None and final.reason == "not_better"
    current = registry.store.current("gCTF:cpu")
    assert current is not None and (current.version, current.restores) == (3, 1)
    assert [r.version for r in registry.store.versions("gCTF:cpu")] == [1, 2, 3]
