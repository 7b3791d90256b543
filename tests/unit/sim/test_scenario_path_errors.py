"""``--scenario`` given a path that holds no scenario file says so, not that no shipped scenario has that name."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli.main import main


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize("name", ["/nope.yaml", "nope.yml", "nope.json", "./nope", "scenarios/nope"])
def test_a_path_that_is_no_file_is_said_to_be_no_file(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--scenario", name]) == 2
    assert _error(capsys) == f"rttsched sim: error: --scenario: no such file {name}"


def test_a_directory_is_no_scenario_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    where = tmp_path / "x.yaml"
    where.mkdir()
    assert main(["sim", "--scenario", str(where)]) == 2
    assert _error(capsys) == f"rttsched sim: error: --scenario: {where} is a directory, not a scenario file"


def test_a_name_that_is_no_shipped_scenario_lists_the_shipped_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--scenario", "nope"]) == 2
    assert _error(capsys).startswith("rttsched sim: error: --scenario: no such scenario 'nope' (shipped: default, ")
