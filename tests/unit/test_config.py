from __future__ import annotations

import pytest

from app.errors import ConfigError


def test_bad_config_names_the_field():
    from app.config import Settings

    with pytest.raises(ConfigError) as info:
        Settings.from_env({"RTT_EXTENDER_PORT": "70000"})
    assert info.value.field == "RTT_EXTENDER_PORT"
    with pytest.raises(ConfigError, match="RTT_SCRAPE_INTERVAL_S: must be a number"):
        Settings.from_env({"RTT_SCRAPE_INTERVAL_S": "fast"})
    with pytest.raises(ConfigError, match="RTT_COLD_START_SAMPLES: must be an integer .got '2.5'."):
        Settings.from_env({"RTT_COLD_START_SAMPLES": "2.5"})


def test_fetch_wait_is_bounded_and_named():
    from app.config import Settings

    assert Settings.from_env({}).kafka_fetch_max_wait_ms == 50
    assert Settings.from_env({"RTT_KAFKA_FETCH_MAX_WAIT_MS": "200"}).kafka_fetch_max_wait_ms == 200
    for bad in ("0", "6000"):
        with pytest.raises(ConfigError) as info:
            Settings.from_env({"RTT_KAFKA_FETCH_MAX_WAIT_MS": bad})
        assert info.value.field == "RTT_KAFKA_FETCH_MAX_WAIT_MS"
