"""Fixtures of the model tests: synthetic RTT rows and a small booster, built once per session."""

from __future__ import annotations

import numpy as np
import pytest
import xgboost
from model_samples import synthetic_rtt, train_small


@pytest.fixture(scope="session")
def rtt_data() -> tuple[np.ndarray, np.ndarray]:
    return synthetic_rtt(600)


@pytest.fixture(scope="session")
def small_booster() -> xgboost.Booster:
    return train_small()
