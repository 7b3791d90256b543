"""Seams of the model layer: what a predictor is, so callers never depend on how it is built."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Predictor(Protocol):
    """Predicts RTT (ms) for rows of features in the order of ``feature_names``."""

    @property
    def feature_names(self) -> tuple[str, ...]: ...

    def predict(self, X: np.ndarray, remember: bool = True) -> np.ndarray:
        """``X``: float32 (n, len(feature_names)), NaN = missing. Returns float64 (n,) RTT in ms.

        ``remember``: a predictor may keep what it predicted for rows it will likely see again (filter, then
        prioritize, of one pod); False when no later call is expected to ask for these rows."""
        ...
