from __future__ import annotations

import pytest

from app.errors import ConfigError


def test_bad_config_names_the_field():
    from app.config import Settings

    with pytest.raises(ConfigError) as info:
        Settings.from_env({"RTT_EXTENDER_PORT": "70000"})
    assert info.value.field == "RTT_EXTENDER_PORT"
    with pytest.raises(ConfigError, match="RTT_SCRAPE_INTERVAL_S: must be a float"):
        Settings.from_env({"RTT_SCRAPE_INTERVAL_S": "fast"})
