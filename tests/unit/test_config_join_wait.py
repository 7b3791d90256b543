"""RTT_JOIN_PREDICTION_WAIT_S against RTT_JOIN_TTL_S: a short TTL alone (valid before the wait existed) caps the
default wait at half of it; a wait that is set and not below the TTL is refused, naming it. The live demo scales the
wait with its speed, as its other wall-clock periods."""

from __future__ import annotations

import dataclasses

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


def test_a_ttl_replaced_after_a_capped_default_wait_gives_the_default_for_the_new_ttl() -> None:
    """The default wait is worked out again from the TTL of the new Settings, not kept as capped for the old one."""
    short = Settings(join_ttl_s=4.0)
    assert short.join_prediction_wait_s == 2.0
    assert dataclasses.replace(short, join_ttl_s=600.0).join_prediction_wait_s == 5.0
    assert dataclasses.replace(short, join_ttl_s=1.0).join_prediction_wait_s == 0.5  # not refused: never set


def test_a_wait_set_not_below_a_replaced_ttl_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError) as info:
        dataclasses.replace(Settings(join_prediction_wait_s=3.0), join_ttl_s=3.0)
    assert str(info.value) == "RTT_JOIN_PREDICTION_WAIT_S: must be < RTT_JOIN_TTL_S (3) (got 3)"
    with pytest.raises(ConfigError, match="^RTT_JOIN_PREDICTION_WAIT_S: "):
        Settings(join_ttl_s=4.0, join_prediction_wait_s=5.0)  # set (to the default's value) is set


def test_settings_lists_the_default_wait_as_a_plain_number() -> None:
    assert ("RTT_JOIN_PREDICTION_WAIT_S", "5.0") in [row[:2] for row in Settings.describe()]
    rows = {r.variable: r for r in Settings(join_ttl_s=4.0).listing({})}
    assert (rows["RTT_JOIN_PREDICTION_WAIT_S"].value, rows["RTT_JOIN_PREDICTION_WAIT_S"].source) == ("2.0", "default")


def test_the_worker_options_hold_the_wait_as_a_plain_float() -> None:
    from app.streams.feedback_options import FeedbackOptions

    wait = FeedbackOptions.from_settings(Settings.from_env({"RTT_JOIN_TTL_S": "4"})).join_prediction_wait_s
    assert type(wait) is float and wait == 2.0
