from __future__ import annotations

import pytest

from app.model import presets
from app.model.presets import cuda_available, default_device, xgb_params


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


def test_auto_device_matches_the_gpu_probe():
    expected = "cuda" if cuda_available() else "cpu"
    assert default_device() == expected
    assert xgb_params("gpu")["device"] == expected


def test_no_visible_gpu_means_cpu(monkeypatch):
    presets.cuda_available.cache_clear()
    monkeypatch.setattr(presets, "_gpu_visible", lambda: False)
    try:
        assert cuda_available() is False
        assert xgb_params("cpu")["device"] == "cpu"
    finally:
        presets.cuda_available.cache_clear()
