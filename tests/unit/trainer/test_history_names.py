"""The trainer's history keeps what a model can train on: a sample with a feature name XGBoost refuses, or one whose
new names would push its key's vocabulary past the cap, is refused as a whole (a ``ContractError`` with its
reason: the trainer dead-letters and counts it, one log line), and the key's names and rows stay as they were.

Before, such a name went into the key's history and failed every retrain of the key with a traceback, and a flood
of names filled the vocabulary first come, first kept, with a WARNING per name and sample, so later samples lost
their real features."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from app.errors import ContractError
from app.features.hardware import HARDWARE_FEATURES
from app.model.errors import TrainingError
from app.model.train import train_model
from app.trainer.history import MAX_FEATURES_PER_KEY, SampleHistory

KEY = "gCTF:gpu"


def sample(i: int, key: str = KEY, **features: float) -> dict[str, Any]:
    return {"model_key": key, "task_id": f"t{i}", "app": key.split(":")[0], "node": "n1", "node_class": "gpu",
            "gpu_model": "Tesla M40", "started_ts": 1000.0 + i, "rtt_ms": 100.0 + i, "input_size_mb": 4.0,
            "features": {"cpu_iowait__mean": float(i), "gpu_count__last": 1.0, **features}}


def test_a_feature_name_xgboost_refuses_is_refused_with_the_sample() -> None:
    h = SampleHistory()
    for i in range(3):
        assert h.add(sample(i))
    names = h.snapshot(KEY)[0]
    with pytest.raises(ContractError) as info:
        h.add({**sample(3), "features": {"gpu_util[0]": 50.0, "cpu_iowait__mean": 1.0}})
    assert info.value.reason == "bad_feature_name" and "'gpu_util[0]'" in str(info.value), str(info.value)
    assert h.count(KEY) == 3 and h.snapshot(KEY)[0] == names  # nothing of it kept
    assert h.add(sample(3))  # the task is not held: a good sample of it later is taken
    assert "gpu_util[0]" not in h.dataset(KEY).names


@pytest.mark.parametrize("name", ["a<b", "x]", "ctl\x07", "", "with space"])
def test_a_bad_name_on_a_new_key_leaves_no_key_behind(name: str) -> None:
    h = SampleHistory()
    with pytest.raises(ContractError, match="bad_feature_name"):
        h.add(sample(0, key="new:cpu", **{name: 1.0}))
    assert h.keys() == [] and h.count("new:cpu") == 0 and h.nbytes == 0


def test_a_flood_of_names_is_refused_whole_with_no_warning_per_name(caplog: pytest.LogCaptureFixture) -> None:
    """The reviewer's flood, past what the contract takes (defence in depth): good samples first, then samples of
    2,100 new names each, then good samples again. Each flood sample is one refusal; the good ones after it keep
    every real feature (hardware counts and the task's size included)."""
    h = SampleHistory()
    for i in range(10):
        h.add(sample(i))
    before = h.snapshot(KEY)[0]
    caplog.set_level(logging.DEBUG, logger="app.trainer.history")
    refusals = []
    for i in range(10, 40):
        flood = {f"f{i}_{j}_{'x' * 20}": 0.5 for j in range(2_100)}
        with pytest.raises(ContractError) as info:
            h.add(sample(i, **flood))
        refusals.append(info.value)
    assert {e.reason for e in refusals} == {"feature_vocabulary_full"}
    assert f"more than the {MAX_FEATURES_PER_KEY:,} a key holds" in str(refusals[0]), str(refusals[0])
    assert caplog.records == []  # the caller logs each refusal once; nothing per name
    assert h.snapshot(KEY)[0] == before and h.count(KEY) == 10
    for i in range(40, 60):
        assert h.add(sample(i, hw_extra__mean=1.0))
    ds = h.dataset(KEY)
    assert not np.isnan(ds.column("hw_gpu_count")[-20:]).any()
    assert not np.isnan(ds.column("task_input_size_mb")[-20:]).any()
    assert len(ds.names) < 20


def test_a_key_fills_its_vocabulary_to_the_cap_and_no_further() -> None:
    """Names come in with the samples that bring them, up to the cap; the sample that would pass it is refused, not
    cut; one that brings only known names is still taken."""
    h = SampleHistory()
    h.add(sample(0))
    held = len(h.snapshot(KEY)[0])
    room = MAX_FEATURES_PER_KEY - held
    assert h.add(sample(1, **{f"m{j}": 1.0 for j in range(room)}))
    assert len(h.snapshot(KEY)[0]) == MAX_FEATURES_PER_KEY
    with pytest.raises(ContractError, match="feature_vocabulary_full"):
        h.add(sample(2, one_more=1.0))
    assert h.add(sample(3, m0=2.0))
    assert len(h.snapshot(KEY)[0]) == MAX_FEATURES_PER_KEY and h.count(KEY) == 3


def test_the_largest_sample_the_contract_takes_fits_a_new_key() -> None:
    from app.contracts.names import FEATURE_NAMES_MAX
    h = SampleHistory()
    assert h.add(sample(0, **{f"m{j}": 1.0 for j in range(FEATURE_NAMES_MAX - 2)}))
    assert len(h.snapshot(KEY)[0]) == FEATURE_NAMES_MAX + len(HARDWARE_FEATURES) + 1 <= MAX_FEATURES_PER_KEY


def test_training_names_the_feature_xgboost_would_refuse() -> None:
    """Should such a name reach training anyway, the error names it (and says why), before XGBoost is called."""
    rng = np.random.default_rng(0)
    X, y = rng.uniform(size=(40, 2)).astype(np.float32), rng.uniform(100, 200, size=40)
    with pytest.raises(TrainingError) as info:
        train_model(X, y, ["cpu_iowait__mean", "gpu_util[0]"], "gpu", params={"n_estimators": 2})
    assert "'gpu_util[0]'" in str(info.value) and "[, ] or <" in str(info.value), str(info.value)
