"""``rttsched sim --out D``: a report file it cannot write (a read-only file, a link to where no file can be)
fails before the first run naming --out; it failed after every run with ``error: PermissionError`` (or
``NotADirectoryError``), the report half written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sim_cli import FAST, error_line

from app.sim.report import report_problem

SYS_READ_ONLY = Path("/sys/kernel/notes")  # refused for writing to root too


def test_a_link_to_where_no_file_can_be_fails_before_any_run(tmp_path, capsys, no_run):
    """A real case for root too: the link's target sits under a file, not a directory."""
    (tmp_path / "plain").write_text("x")
    out = tmp_path / "out"
    out.mkdir()
    (out / "policies.json").symlink_to(tmp_path / "plain" / "policies.json")
    line = error_line([*FAST, "--out", str(out)], capsys)
    assert line == f"rttsched sim: error: --out: cannot write {out / 'policies.json'}: Not a directory"
    assert not no_run


def _unwritable(path: Path) -> bool:
    try:
        with path.open("ab"):
            return False
    except OSError:
        return True


@pytest.mark.skipif(not SYS_READ_ONLY.is_file() or not _unwritable(SYS_READ_ONLY), reason="no read-only sysfs file")
def test_a_link_to_a_read_only_file_fails_before_any_run(tmp_path, capsys, no_run):
    (tmp_path / "policies.csv").symlink_to(SYS_READ_ONLY)
    line = error_line([*FAST, "--out", str(tmp_path)], capsys)
    assert line.startswith(f"rttsched sim: error: --out: cannot write {tmp_path / 'policies.csv'}: ")
    assert not no_run


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a read-only file")
def test_a_read_only_report_file_fails_before_any_run(tmp_path, capsys, no_run):
    target = tmp_path / "policies.csv"
    target.write_text("old")
    target.chmod(0o444)
    line = error_line([*FAST, "--out", str(tmp_path)], capsys)
    assert line == f"rttsched sim: error: --out: cannot write {target}: Permission denied"
    assert not no_run and target.read_text() == "old"


def test_writable_targets_pass_and_are_left_as_they_are(tmp_path):
    (tmp_path / "policies.csv").write_text("old")
    (tmp_path / "report.html").symlink_to(tmp_path / "elsewhere.html")  # a link to a file not there yet
    assert report_problem(tmp_path) is None
    assert (tmp_path / "policies.csv").read_text() == "old" and not (tmp_path / "elsewhere.html").exists()


def test_a_directory_where_a_file_goes_is_still_named(tmp_path):
    (tmp_path / "report.html").mkdir()
    assert report_problem(tmp_path) == f"{tmp_path / 'report.html'} is a directory, where the report writes a file"
    assert report_problem(tmp_path, html=False) is None
