from __future__ import annotations

import importlib
from collections.abc import Callable

import pytest

from app.sim.runner import SimConfig


@pytest.fixture
def small_config() -> SimConfig:
    return SimConfig(n_tasks=800)


@pytest.fixture
def bench_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[[str, list[str]], str]:
    """Run bench script ``name``'s ``main()`` with ``argv``; assert it exits with argparse's status 2 and return
    its error line (``NAME.py: error: ...``, without the usage lines above it, which name every option)."""

    def run(name: str, argv: list[str]) -> str:
        monkeypatch.setattr("sys.argv", [f"{name}.py", *argv])
        with pytest.raises(SystemExit) as exc:
            importlib.import_module(name).main()
        assert exc.value.code == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith(f"{name}.py: error: ")]
        assert len(errors) == 1
        return errors[0].removeprefix(f"{name}.py: error: ")

    return run


@pytest.fixture
def no_run(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Records every simulated run; a bad flag must stop the command before the first."""
    calls: list[object] = []

    def run_offline(*args: object, **kwargs: object) -> None:
        calls.append(args)
        raise AssertionError("a run started")

    monkeypatch.setattr("app.sim.runner.run_offline", run_offline)
    return calls

