"""One base error for the whole package; every subpackage derives its own from it."""

from __future__ import annotations


class RttError(Exception):
    """Base of every error this project raises on purpose."""


class ConfigError(RttError, ValueError):
    """A setting is missing or invalid. ``field`` names it (env var or dotted path)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class ContractError(RttError, ValueError):
    """A message does not satisfy its topic contract. ``reason`` is short and stable (a metric label)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)
