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


def read_error(exc: BaseException) -> str:
    """An error reading a YAML/JSON file in one line: a parser error as ``line L, column C: problem`` (PyYAML's
    own text spans several lines, with a caret under the spot), anything else as its message.

    >>> import yaml
    >>> try:
    ...     yaml.safe_load("a: [1\\n")
    ... except yaml.YAMLError as e:
    ...     read_error(e)
    "line 2, column 1: expected ',' or ']', but got '<stream end>'"
    """
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is not None and problem:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return str(getattr(exc, "strerror", None) or exc).replace("\n", " ")
