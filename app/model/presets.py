"""XGBoost hyper-parameters per node class, and whether XGBoost can train on a GPU here.

The presets are the seed's: CPU nodes (steadier RTT) get a smaller, faster-learning ensemble; GPU nodes
(RTT fluctuating 3–5x more) get more, deeper trees with a lower learning rate and stronger row
subsampling. ``max_bin=512`` keeps fine resolution on skewed metrics; ``tree_method="hist"`` with
``device="cuda"`` replaces ``gpu_hist``, deprecated since XGBoost 2.0. The objective is ``reg:gamma``: RTT
is positive and its noise and contention act as factors, which a log link fits as sums (measured against
squared error through the simulator's learning path: docs/model.md).

``n_estimators`` is the scikit-learn name; :func:`app.model.train.train_model` passes it to
``xgboost.train`` as ``num_boost_round``.

>>> p = xgb_params("cpu", device="cpu")
>>> p["n_estimators"], p["max_depth"], p["learning_rate"], p["subsample"], p["max_bin"], p["device"]
(100, 6, 0.1, 0.8, 512, 'cpu')
>>> xgb_params("gpu", device="cpu")["n_estimators"]
150
>>> xgb_params("tpu")
Traceback (most recent call last):
...
ValueError: node_class: must be 'cpu' or 'gpu' (got 'tpu')
"""

from __future__ import annotations

import functools
import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import xgboost

log = logging.getLogger(__name__)

NODE_CLASSES = ("cpu", "gpu")

_COMMON: dict[str, Any] = {
    "objective": "reg:gamma",  # a positive target with multiplicative noise: a log link (docs/model.md)
    "tree_method": "hist",
    "max_bin": 512,
}

PRESETS: dict[str, dict[str, Any]] = {
    "cpu": {"n_estimators": 100, "max_depth": 6, "learning_rate": 0.1, "subsample": 0.8},
    "gpu": {"n_estimators": 150, "max_depth": 8, "learning_rate": 0.05, "subsample": 0.6},
}

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?|gpu(:\d+)?)$")


def _gpu_visible() -> bool:
    return shutil.which("nvidia-smi") is not None or Path("/dev/nvidiactl").exists()


@functools.cache
def cuda_available() -> bool:
    """True when this XGBoost build has CUDA and a tiny training really ran on a GPU (checked once).

    XGBoost silently falls back to the CPU when ``device="cuda"`` finds no GPU, so the trial reads the
    device back from the trained booster's configuration instead of trusting that no error was raised.
    """
    try:
        if not xgboost.build_info().get("USE_CUDA"):
            return False
        if not _gpu_visible():
            return False
        X = np.arange(32, dtype=np.float32).reshape(16, 2)
        y = np.arange(16, dtype=np.float32)
        with xgboost.config_context(verbosity=0):
            booster = xgboost.train(
                {"device": "cuda", "tree_method": "hist", "max_depth": 2}, xgboost.DMatrix(X, label=y), 1
            )
        device = json.loads(booster.save_config())["learner"]["generic_param"]["device"]
        ok = str(device).startswith(("cuda", "gpu"))
    except Exception as exc:  # any failure of the trial means: do not train on a GPU
        log.info("CUDA trial training failed, XGBoost will use the CPU: %s", exc)
        return False
    log.info("XGBoost device: %s", "cuda" if ok else "cpu")
    return ok


def default_device() -> str:
    """``"cuda"`` when :func:`cuda_available`, else ``"cpu"``."""
    return "cuda" if cuda_available() else "cpu"


def xgb_params(node_class: str, *, device: str | None = None) -> dict[str, Any]:
    """A fresh dict of XGBoost parameters for a model of ``node_class`` (``"cpu"`` or ``"gpu"``).

    Parameters
    ----------
    node_class
        Class of the nodes the model predicts for (second part of a model key).
    device
        ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; ``None`` picks ``"cuda"`` only when a GPU is usable.
    """
    if node_class not in PRESETS:
        raise ValueError(f"node_class: must be 'cpu' or 'gpu' (got {node_class!r})")
    if device is None:
        device = default_device()
    elif not _DEVICE.match(device):
        raise ValueError(f"device: must be 'cpu', 'cuda' or 'cuda:N' (got {device!r})")
    return {**_COMMON, **PRESETS[node_class], "device": device}
