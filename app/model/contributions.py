"""Why a model predicted what it did: per-feature contributions from XGBoost's own ``pred_contribs``.

XGBoost splits a row's prediction on the *margin* scale into one contribution per feature plus a bias
(the last column), and they add up to the margin exactly (up to float32 rounding)::

    sum(contributions) + bias == margin,   prediction == link⁻¹(margin)

For the production objective ``reg:gamma`` (and ``reg:tweedie``, ``count:poisson``) the link is the log, so
the prediction is ``exp(margin)`` and a contribution ``c`` multiplies the RTT by ``exp(c)``; for squared-error
objectives the link is the identity and ``c`` adds milliseconds.

Two methods, both XGBoost's: ``approx`` (``approx_contribs=True``: each split's change of the expected value
along the row's path goes to the split's feature) and ``exact`` (TreeSHAP, Shapley values). The path method
costs about a tree walk; TreeSHAP is two orders of magnitude slower on the GPU preset's 150 trees of depth 8
(``bench/bench_explain.py``).

>>> import numpy as np, xgboost
>>> X = np.array([[0.0, 1.0], [1.0, 0.0], [2.0, 1.0], [3.0, 0.0]] * 8, dtype=np.float32)
>>> b = xgboost.train({"objective": "reg:gamma", "max_depth": 2}, xgboost.DMatrix(X, label=10 + X[:, 0]), 10)
>>> c = contributions(b, X[:2], ("load", "size"))
>>> c.link, bool(np.allclose(c.prediction(), b.predict(xgboost.DMatrix(X[:2])), rtol=1e-5))
('log', True)
>>> [name for name, _value, _c in c.top(0, 1)]
['load']
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence

import numpy as np
import xgboost

from app.model.forest import LOG_OBJECTIVES

METHODS = ("approx", "exact")


@dataclasses.dataclass(frozen=True)
class Contributions:
    """Contributions of ``names`` for each row of ``X`` (``values``: (n, len(names))), the bias and the margin."""

    names: tuple[str, ...]
    X: np.ndarray
    values: np.ndarray
    bias: np.ndarray
    margin: np.ndarray  # XGBoost's own output_margin prediction, for the identity check
    link: str  # "log" or "identity"
    method: str

    def prediction(self) -> np.ndarray:
        """The predictions the contributions add up to (through the link)."""
        total = self.values.sum(axis=1, dtype=np.float64) + self.bias
        return np.exp(total) if self.link == "log" else total

    def top(self, i: int, k: int) -> list[tuple[str, float, float]]:
        """Row ``i``'s ``k`` largest contributions by size: (feature, its value (NaN: missing), contribution)."""
        order = np.argsort(-np.abs(self.values[i]), kind="stable")[:k]
        return [(self.names[j], float(self.X[i, j]), float(self.values[i, j])) for j in order.tolist()]


def link_of(booster: xgboost.Booster) -> str:
    """``log`` for the log-link objectives, else ``identity``."""
    objective = json.loads(booster.save_config())["learner"]["objective"]["name"]
    return "log" if objective in LOG_OBJECTIVES else "identity"


def contributions(booster: xgboost.Booster, X: np.ndarray, names: Sequence[str], *,
                  method: str = "approx") -> Contributions:
    """XGBoost's ``pred_contribs`` for the rows ``X`` (float32, NaN = missing, columns in ``names``' order)."""
    if method not in METHODS:
        raise ValueError(f"contributions.method: must be one of {', '.join(METHODS)} (got {method!r})")
    X = np.ascontiguousarray(X, dtype=np.float32)
    if X.ndim != 2 or X.shape[1] != len(names):
        raise ValueError(f"contributions: X has shape {X.shape}, the model has {len(names)} features")
    own = booster.feature_names
    if own is not None and tuple(own) != tuple(names):
        raise ValueError(f"contributions: the booster's features {tuple(own)} are not {tuple(names)}")
    dm = xgboost.DMatrix(X, missing=math.nan, nthread=1)  # columns checked above: no names to validate again
    raw = booster.predict(dm, pred_contribs=True, approx_contribs=method == "approx", validate_features=False)
    margin = booster.predict(dm, output_margin=True, validate_features=False)
    raw = np.asarray(raw, dtype=np.float64).reshape(X.shape[0], len(names) + 1)
    return Contributions(tuple(names), X, raw[:, :-1], raw[:, -1], np.asarray(margin, dtype=np.float64),
                         link_of(booster), method)
