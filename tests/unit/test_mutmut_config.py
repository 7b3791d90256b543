"""``mutmut run`` (README) copies only ``source_paths`` and ``also_copy`` into its ``mutants/`` tree and runs pytest
there: every folder pytest's ``pythonpath`` names must be copied too, or the run stops before testing anything
(tests/conftest.py imports the fault scenarios of bench/: "No module named 'fault_stack'")."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mutmut_copies_every_folder_pytest_imports_from() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    copied = set(tool["mutmut"]["source_paths"]) | set(tool["mutmut"]["also_copy"])
    needed = set(tool["pytest"]["ini_options"].get("pythonpath", []))
    assert needed, "pytest's pythonpath is empty: this test has nothing left to check"
    assert needed <= copied, f"not copied into mutants/: {sorted(needed - copied)}"


# Run as mutmut does: the tests' set-up (tests/conftest.py) and XGBoost in one process, then a fork that uses
# XGBoost again. Exit 0: the child finished; 1: it hung (the deadlock that stopped `mutmut run` for good).
_FORK_AFTER_XGBOOST = """
import importlib.util, os, sys, time
spec = importlib.util.spec_from_file_location("conftest_under_mutmut", sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
import numpy as np, xgboost
X = np.random.default_rng(0).random((20000, 8), dtype=np.float32)
xgboost.DMatrix(X, nthread=2)  # explicit threads, as app.model.train asks for: an OpenMP pool starts
pid = os.fork()
if pid == 0:
    xgboost.DMatrix(X, nthread=2)
    os._exit(0)
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    if os.waitpid(pid, os.WNOHANG)[0]:
        sys.exit(0)
    time.sleep(0.05)
os.kill(pid, 9)
sys.exit(1)
"""


def test_a_mutant_forked_after_xgboost_ran_does_not_hang() -> None:
    env = {**os.environ, "MUTANT_UNDER_TEST": "", "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "bench")])}
    env.pop("OMP_NUM_THREADS", None)
    env.pop("OMP_THREAD_LIMIT", None)
    done = subprocess.run([sys.executable, "-c", _FORK_AFTER_XGBOOST, str(ROOT / "tests" / "conftest.py")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"the forked child hung in XGBoost's OpenMP pool\n{done.stderr[-2000:]}"
