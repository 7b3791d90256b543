"""``rttsched sim`` in the tests: a small run's flags and the one error line of a refused one."""

from __future__ import annotations

import pytest

from app.cli.main import main

FAST = ["--tasks", "50", "--seeds", "1", "--policies", "kube_default", "--no-html"]


def error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``rttsched sim`` with ``argv``; assert it exits 2 with one error line and no traceback; that line."""
    assert main(["sim", *argv]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "Traceback" not in out.err
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]
