"""The README's benchmark table: every script it lists exists and offers the short run the README promises."""

from __future__ import annotations

import contextlib
import io
import re
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LISTED = sorted(set(re.findall(r"python3 (bench/\w+\.py)", (ROOT / "README.md").read_text(encoding="utf-8"))))
OWN_OPTION = {"bench/bench_chaos.py": "--only", "bench/bench_soak.py": "--minutes",
              "bench/bench_update_latency.py": "rttsched demo"}  # what the README says these take instead


def _help(script: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(sys, "argv", [script, "--help"])
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / script), run_name="__main__")
    assert done.value.code == 0
    return out.getvalue()


def test_the_readme_lists_the_benchmarks() -> None:
    assert len(LISTED) >= 15 and all((ROOT / s).is_file() for s in LISTED)


@pytest.mark.parametrize("script", LISTED)
def test_each_listed_benchmark_has_a_short_run(script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert OWN_OPTION.get(script, "--quick") in _help(script, monkeypatch)


@pytest.mark.parametrize(("argv", "message"), [
    (["bench/bench_learning.py", "--preset", "nope"], "argument --preset: invalid choice: 'nope'"),
    (["bench/bench_learning.py", "--tasks", "-5"], "argument --tasks: must be an integer >= 1 (got '-5')"),
    (["bench/bench_body.py", "--mb", "-1"], "argument --mb: must be a number > 0 (got '-1')"),
    (["bench/bench_predict.py", "--features", "0"], "argument --features: must be an integer >= 1 (got '0')"),
    (["bench/bench_policies.py", "--policies", "nope"], "--policies: unknown 'nope'; known: kube_default"),
    (["bench/bench_policies.py", "--markdown", "/nonexistent/p.json"], "--markdown: cannot read /nonexistent/p.json"),
])
def test_a_bad_option_is_a_usage_error_before_any_run(argv: list[str], message: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / argv[0]), run_name="__main__")
    assert done.value.code == 2 and message in err.getvalue()
