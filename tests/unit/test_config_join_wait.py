"""RTT_JOIN_PREDICTION_WAIT_S against RTT_JOIN_TTL_S: a short TTL alone (valid before the wait existed) caps the
default wait at half of it; a wait that is set and not below the TTL is refused, naming it. The live demo scales the
wait with its speed, as its other wall-clock periods."""

from __future__ import annotations

import pytest

from app.config import Settings
from app.errors import ConfigError
from app.sim.live import scaled_worker_env


@pytest.mark.parametrize(("ttl", "wait"), [("5", 2.5), ("1", 0.5), ("10", 5.0), ("600", 5.0)])
def test_a_short_join_ttl_alone_still_starts_with_the_wait_capped(ttl: str, wait: float) -> None:
    settings = Settings.from_env({"RTT_JOIN_TTL_S": ttl})
    assert settings.join_ttl_s == float(ttl) and settings.join_prediction_wait_s == wait


def test_built_directly_with_a_short_ttl_the_default_wait_is_capped_too() -> None:
    assert Settings(join_ttl_s=4.0).join_prediction_wait_s == 2.0


@pytest.mark.parametrize("wait", ["5", "7"])
def test_a_wait_set_not_below_the_ttl_is_refused_naming_it(wait: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"RTT_JOIN_TTL_S": "5", "RTT_JOIN_PREDICTION_WAIT_S": wait})
    assert str(info.value) == f"RTT_JOIN_PREDICTION_WAIT_S: must be < RTT_JOIN_TTL_S (5) (got {wait})"


def test_a_wait_set_below_a_short_ttl_is_kept() -> None:
    assert Settings.from_env({"RTT_JOIN_TTL_S": "5", "RTT_JOIN_PREDICTION_WAIT_S": "4"}).join_prediction_wait_s == 4.0


def test_the_live_demo_scales_the_prediction_wait_with_its_speed() -> None:
    assert scaled_worker_env(Settings(), 5.0)["RTT_JOIN_PREDICTION_WAIT_S"] == "1.0"
    assert scaled_worker_env(Settings(), 1.0) == {}


def test_a_slow_demo_keeps_the_scaled_wait_below_the_ttl() -> None:
    env = scaled_worker_env(Settings(join_ttl_s=60.0), 0.01)
    settings = Settings.from_env({"RTT_JOIN_TTL_S": "60", **env})
    assert settings.join_prediction_wait_s == 30.0
