from __future__ import annotations

import pytest

from app.sim.runner import SimConfig


@pytest.fixture
def small_config() -> SimConfig:
    return SimConfig(n_tasks=800)
