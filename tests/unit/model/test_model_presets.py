from __future__ import annotations

import json
import warnings

import pytest
import xgboost
from model_samples import synthetic_rtt

from app.model import presets
from app.model.presets import cuda_available, default_device, xgb_params
from app.model.train import train_model


def test_cpu_and_gpu_presets_follow_the_seed():
    cpu = xgb_params("cpu", device="cpu")
    gpu = xgb_params("gpu", device="cpu")
    assert (cpu["n_estimators"], cpu["max_depth"], cpu["learning_rate"], cpu["subsample"]) == (100, 6, 0.1, 0.8)
    assert (gpu["n_estimators"], gpu["max_depth"], gpu["learning_rate"], gpu["subsample"]) == (150, 8, 0.05, 0.6)
    for p in (cpu, gpu):
        assert p["max_bin"] == 512
        assert p["tree_method"] == "hist"
        assert "gpu_hist" not in p.values()


def test_each_call_returns_a_fresh_dict():
    a = xgb_params("cpu", device="cpu")
    a["max_depth"] = 99
    assert xgb_params("cpu", device="cpu")["max_depth"] == 6


@pytest.mark.parametrize("node_class", ["tpu", "", "CPU", "gpu:worker-1"])
def test_unknown_node_class_is_named_in_the_error(node_class):
    with pytest.raises(ValueError, match=f"node_class.*{node_class!r}"):
        xgb_params(node_class)


@pytest.mark.parametrize("device", ["cuda", "cuda:1", "cpu"])
def test_explicit_device_is_kept(device):
    assert xgb_params("gpu", device=device)["device"] == device


@pytest.mark.parametrize("device", ["gpu_hist", "CUDA", "cuda:x", ""])
def test_bad_device_is_refused(device):
    with pytest.raises(ValueError, match="device"):
        xgb_params("gpu", device=device)


class _TrialBooster:
    """What the CUDA trial reads back from a trained booster: the device it really trained on."""

    def __init__(self, device: str) -> None:
        self.device = device

    def save_config(self) -> str:
        return json.dumps({"learner": {"generic_param": {"device": self.device}}})


@pytest.fixture
def fake_cuda(monkeypatch):
    """A CUDA build and a visible GPU; ``trained_on`` is what the trial booster reports, ``calls`` its params."""
    state = {"trained_on": "cuda:0", "calls": []}

    def train(params, dtrain, rounds):
        state["calls"].append(dict(params))
        if state["trained_on"] is None:
            raise xgboost.core.XGBoostError("no CUDA-capable device is detected")
        return _TrialBooster(state["trained_on"])

    presets.cuda_available.cache_clear()
    monkeypatch.setattr(xgboost, "build_info", lambda: {"USE_CUDA": True})
    monkeypatch.setattr(presets, "_gpu_visible", lambda: True)
    monkeypatch.setattr(xgboost, "train", train)
    yield state
    presets.cuda_available.cache_clear()


def test_a_gpu_that_really_trains_means_cuda(fake_cuda):
    assert cuda_available() is True and default_device() == "cuda"
    assert xgb_params("gpu")["device"] == "cuda" and xgb_params("cpu")["device"] == "cuda"
    assert len(fake_cuda["calls"]) == 1, "the trial runs once per process"
    assert fake_cuda["calls"][0]["device"] == "cuda"


@pytest.mark.parametrize("trained_on", ["cpu", None])
def test_a_silent_fallback_or_a_failed_trial_means_cpu(fake_cuda, trained_on):
    fake_cuda["trained_on"] = trained_on  # XGBoost fell back to the CPU / raised
    assert cuda_available() is False and xgb_params("gpu")["device"] == "cpu"


def test_no_cuda_build_means_cpu_without_a_trial(fake_cuda, monkeypatch):
    monkeypatch.setattr(xgboost, "build_info", lambda: {"USE_CUDA": False})
    assert cuda_available() is False and fake_cuda["calls"] == []


def test_no_visible_gpu_means_cpu_without_a_trial(fake_cuda, monkeypatch):
    monkeypatch.setattr(presets, "_gpu_visible", lambda: False)
    assert cuda_available() is False and xgb_params("cpu")["device"] == "cpu"
    assert fake_cuda["calls"] == []


def test_training_assembles_the_cuda_parameters_when_a_gpu_is_usable(monkeypatch):
    """The real training path with the probe saying yes: XGBoost gets device="cuda" (it falls back to the CPU
    with a warning where there is no GPU), and the booster comes back set to predict on the CPU."""
    monkeypatch.setattr(presets, "cuda_available", lambda: True)
    X, y = synthetic_rtt(60)
    names = [f"m{i}__mean" for i in range(X.shape[1])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Device is changed from GPU to CPU" without a GPU
        res = train_model(X, y, names, "gpu", params={"n_estimators": 3, "nthread": 1})
    assert res.params["device"] == "cuda"
    assert (res.params["max_depth"], res.params["learning_rate"], res.params["subsample"]) == (8, 0.05, 0.6)
    assert (res.params["tree_method"], res.params["max_bin"]) == ("hist", 512)
    assert json.loads(res.booster.save_config())["learner"]["generic_param"]["device"] == "cpu"
    explicit = train_model(X, y, names, "gpu", params={"n_estimators": 3, "nthread": 1, "device": "cpu"})
    assert explicit.params["device"] == "cpu", "an explicit device wins over the probe"
