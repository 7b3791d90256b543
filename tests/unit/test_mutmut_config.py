"""``mutmut run`` (README) copies only ``source_paths`` and ``also_copy`` into its ``mutants/`` tree and runs pytest
there: every folder pytest's ``pythonpath`` names must be copied too, or the run stops before testing anything
(tests/conftest.py imports the fault scenarios of bench/: "No module named 'fault_stack'")."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mutmut_copies_every_folder_pytest_imports_from() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    copied = set(tool["mutmut"]["source_paths"]) | set(tool["mutmut"]["also_copy"])
    needed = set(tool["pytest"]["ini_options"].get("pythonpath", []))
    assert needed, "pytest's pythonpath is empty: this test has nothing left to check"
    assert needed <= copied, f"not copied into mutants/: {sorted(needed - copied)}"
