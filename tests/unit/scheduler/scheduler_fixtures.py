"""Helpers of the scheduling-layer tests: a tiny linear predictor and message builders."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.scheduler.builder import SnapshotBuilder


class LinearPredictor:
    """rtt_ms = bias + sum(w_f * x_f), NaN treated as 0; counts predict calls and rows."""

    def __init__(self, weights: dict[str, float], bias: float = 0.0) -> None:
        self._names = tuple(weights)
        self._w = np.array(list(weights.values()), dtype=np.float64)
        self.bias = bias
        self.calls: list[int] = []

    @property
    def feature_names(self) -> tuple[str, ...]:
        return self._names

    def predict(self, X: np.ndarray, remember: bool = True) -> np.ndarray:
        assert X.dtype == np.float32 and X.shape[1] == len(self._names)
        self.calls.append(X.shape[0])
        return self.bias + np.nan_to_num(X.astype(np.float64)) @ self._w


def features_msg(node: str, ts: float, load: float, node_class: str = "gpu", gpu_model: str | None = "Tesla M40",
                 **extra: float) -> dict[str, Any]:
    return {"node": node, "ts": ts, "node_class": node_class, "gpu_model": gpu_model if node_class == "gpu" else None,
            "window_s": 30.0, "count": 30, "features": {"load__mean": load, **extra}}


def weights_msg(node: str, ts: float, weight: float, stale: bool = False, **rtt: float) -> dict[str, Any]:
    return {"node": node, "ts": ts, "weight": weight, "predicted_rtt_ms": rtt, "stale": stale}


def make_linear() -> LinearPredictor:
    return LinearPredictor({"load__mean": 100.0, "task_input_size_mb": 0.1}, bias=50.0)


def make_view(linear: LinearPredictor) -> SnapshotBuilder:
    """Three fresh GPU nodes (load 1, 2, 4) at ts=1000, credibility 1, and ``linear`` as gCTF:gpu v3."""
    b = SnapshotBuilder()
    for name, load in (("fast", 1.0), ("mid", 2.0), ("slow", 4.0)):
        b.apply_node_features(features_msg(name, 1000.0, load))
        b.apply_node_weights(weights_msg(name, 1000.0, 1.0))
    b.set_model("gCTF:gpu", 3, linear)
    return b
