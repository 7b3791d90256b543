"""A flag that overrides a setting says so in ``--help``: it names the environment variable it overrides, and the
worker's and trainer's flags the default that variable has, so that a reader of ``rttsched worker --help`` knows
the variable is honoured too (``--history-s`` said "default 120" without naming RTT_FEATURE_HISTORY_S)."""

from __future__ import annotations

import argparse
import ast
import importlib

import pytest

from app.config import Settings

COMMANDS = ("worker", "trainer", "pods", "extender")  # the commands whose flags override a variable (their FLAGS)


def _defaults() -> dict[str, object]:
    return {name: ast.literal_eval(default) for name, default, _doc in Settings.describe()}


def _shown(default: object) -> str | None:
    """How a help text writes a default: 120.0 as 120, 0.02 as 0.02; None where it is said in words (empty, 0)."""
    if default in ("", 0):
        return None
    return f"{default:g}" if isinstance(default, float) else str(default)


def _flags(command: str) -> list[tuple[str, str, str]]:
    """(flag, variable, help text) of every flag of ``command`` that overrides a variable."""
    mod = importlib.import_module(f"app.cli.{command}")
    parser = argparse.ArgumentParser(prog=f"rttsched {command}")
    mod.add_arguments(parser)
    helps = {opt: action.help or "" for action in parser._actions for opt in action.option_strings}
    return [(flag, var, helps[flag]) for flag, var in mod.FLAGS.items()]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_flag_s_help_names_the_variable_it_overrides(command):
    defaults = _defaults()
    flags = _flags(command)
    assert flags
    for flag, var, text in flags:
        assert var in defaults, (command, flag, var)
        assert var in text, f"rttsched {command} {flag}: the help does not name {var}: {text!r}"


@pytest.mark.parametrize("command", ["worker", "trainer"])
def test_the_worker_s_and_trainer_s_flags_give_their_variable_s_default(command):
    defaults = _defaults()
    for flag, var, text in _flags(command):
        shown = _shown(defaults[var])
        if shown is not None:
            assert shown in text, f"rttsched {command} {flag}: the help does not give {var}'s default {shown}: {text!r}"
