"""Small synthetic RTT data and boosters for the model tests (few trees: fast)."""

from __future__ import annotations

import numpy as np
import xgboost


def synthetic_rtt(n: int, n_features: int = 6, *, seed: int = 0, missing: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """Rows in time order: RTT (ms) depends on the first features non-linearly; ``missing`` of X is NaN."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, n_features)).astype(np.float32)
    y = 200 + 60 * X[:, 0] + 40 * np.sin(2 * X[:, 1]) + 20 * X[:, 2] * X[:, 3] + rng.normal(scale=5, size=n)
    X[rng.random(X.shape) < missing] = np.nan
    return X, np.maximum(y, 1.0)


def train_small(objective: str = "reg:squarederror", *, depth: int = 4, rounds: int = 12, seed: int = 0,
                missing: float = 0.1, n: int = 400) -> xgboost.Booster:
    X, y = synthetic_rtt(n, seed=seed, missing=missing)
    params = {"objective": objective, "max_depth": depth, "tree_method": "hist", "max_bin": 64, "seed": seed,
              "nthread": 1}
    names = [f"m{i}__mean" for i in range(X.shape[1])]
    return xgboost.train(params, xgboost.DMatrix(X, label=y, feature_names=names), rounds)
