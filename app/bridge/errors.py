"""Errors of the bridge, all under :class:`app.errors.RttError`."""

from __future__ import annotations

from app.errors import ConfigError, RttError


class BridgeError(RttError):
    """Base of the bridge's own errors."""


class ExpositionError(BridgeError):
    """A scrape body is not valid Prometheus text exposition."""


class MappingError(ConfigError):
    """The exporter-to-canonical mapping file is invalid; ``field`` is the path inside it."""


class TargetError(ConfigError):
    """A scrape target (flag or targets file) is invalid; ``field`` names the flag or file path."""
