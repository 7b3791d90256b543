"""``rttsched select`` reading what people hand it: a CSV file with a line short of cells, a header naming a
column twice, an Excel byte-order mark, app names with terminal escapes; ``--json`` checked before the work,
``--input`` a directory. Every refusal is one line, exit 2. (The selection itself:
``tests/unit/features/test_selection.py``.)"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from app.cli.main import main


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one line on stderr; nothing on stdout; no traceback and no exception class name."""
    got = capsys.readouterr()
    assert got.out == "", got.out
    assert "Traceback" not in got.err, got.err
    assert not re.search(r"\b\w+(Error|Exception)\b", got.err), got.err
    lines = got.err.strip().splitlines()
    assert len(lines) == 1, got.err
    return lines[0]


def _samples(apps: tuple[str, ...] = ("gCTF",), n: int = 40) -> list[str]:
    """A header and ``n`` rows per app: ``x`` drives ``rtt_ms``, ``noise`` does not."""
    rng = np.random.default_rng(1)
    lines = ["app,x,noise,rtt_ms"]
    for app in apps:
        for x, noise in zip(rng.uniform(0, 10, n), rng.uniform(0, 10, n), strict=True):
            lines.append(f"{app},{x:.4f},{noise:.4f},{3 * x + 20 + rng.normal(scale=0.5):.4f}")
    return lines


def _write(path: Path, lines: list[str], prefix: bytes = b"") -> str:
    path.write_bytes(prefix + ("\n".join(lines) + "\n").encode())
    return str(path)


# -- a malformed CSV line is one error line and exit 2, short or long (short ones were read as missing values)

def test_a_line_short_of_cells_is_refused_naming_the_line(tmp_path, capsys):
    src = _write(tmp_path / "short.csv", ["app,x,rtt_ms", "g,1,2", "g,2"])
    assert main(["select", "--input", src]) == 2
    assert error_line(capsys) == f"rttsched select: error: {src}:3: fewer cells than header columns (2 of 3)"


def test_a_line_with_more_cells_is_still_refused(tmp_path, capsys):
    src = _write(tmp_path / "long.csv", ["app,x,rtt_ms", "g,1,2,9"])
    assert main(["select", "--input", src]) == 2
    assert error_line(capsys) == f"rttsched select: error: {src}:2: more cells than header columns"


def test_empty_cells_are_still_missing_values(tmp_path, capsys):
    lines = _samples()
    lines[3] = "gCTF,,1.0,30.0"
    assert main(["select", "--input", _write(tmp_path / "gaps.csv", lines)]) == 0
    assert "== gCTF: 40 samples" in capsys.readouterr().out


def test_a_header_naming_a_column_twice_is_refused(tmp_path, capsys):
    src = _write(tmp_path / "dup.csv", ["app,x,x,rtt_ms", "g,1,2,3"])
    assert main(["select", "--input", src]) == 2
    assert error_line(capsys) == f"rttsched select: error: {src}:1: column 'x' is named twice in the header"


def test_an_excel_byte_order_mark_is_no_part_of_the_first_column(tmp_path, capsys):
    src = _write(tmp_path / "bom.csv", _samples(), prefix=b"\xef\xbb\xbf")
    assert main(["select", "--input", src]) == 0
    assert "== gCTF: 40 samples" in capsys.readouterr().out


def test_a_byte_order_mark_before_json_lines_is_read_past(tmp_path, capsys):
    from app.contracts import encode

    rng = np.random.default_rng(2)
    msgs = [encode("training-samples", {
        "model_key": "gCTF:gpu", "task_id": f"t{i}", "app": "gCTF", "node": "w1", "node_class": "gpu",
        "started_ts": 1.7e9 + i, "rtt_ms": 3 * x + 20.0, "features": {"x": float(x), "noise": float(rng.uniform())}})
        for i, x in enumerate(rng.uniform(0, 10, 40))]
    src = tmp_path / "bom.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + b"\n".join(msgs) + b"\n")
    assert main(["select", "--input", str(src)]) == 0
    assert "== gCTF: 40 samples" in capsys.readouterr().out


def test_app_names_are_printed_with_control_characters_escaped(tmp_path, capsys):
    evil = "g\x1b[2J\x1b[31mred\rx"
    lines = _samples(("gCTF", evil))
    src = _write(tmp_path / "evil.csv", [line.replace(evil, f'"{evil}"') for line in lines])
    out = tmp_path / "report.json"
    assert main(["select", "--input", src, "--json", str(out)]) == 0
    got = capsys.readouterr()
    assert "\x1b" not in got.out + got.err and "\r" not in got.out + got.err
    shown = "g\\x1b[2J\\x1b[31mred\\rx"
    assert f"== {shown}: 40 samples" in got.out
    assert any(line.startswith(shown + " ") for line in got.out.splitlines())  # the shares table's row
    assert evil in json.loads(out.read_text())["apps"]  # the report keeps the name as it is


def test_feature_names_are_printed_with_control_characters_escaped(tmp_path, capsys):
    lines = _samples()
    lines[0] = 'app,"x\x1b[8m",noise,rtt_ms'
    assert main(["select", "--input", _write(tmp_path / "evil.csv", lines), "--min-votes", "1"]) == 0
    got = capsys.readouterr()
    assert "\x1b" not in got.out + got.err and "x\\x1b[8m" in got.out


# -- --json checked before the work (it was checked after every table had been printed); --input a directory

@pytest.mark.parametrize(("target", "said"), [
    ("/proc/x.json", "--json: cannot write /proc/x.json: No such file or directory"),
    ("{tmp}/missing/x.json", "--json: cannot write {tmp}/missing/x.json: No such file or directory"),
    ("{tmp}", "--json: {tmp} is a directory, where a file is written"),
])
def test_a_json_report_that_cannot_be_written_fails_before_the_work(target, said, tmp_path, capsys):
    src = _write(tmp_path / "samples.csv", _samples())
    assert main(["select", "--input", src, "--json", target.format(tmp=tmp_path)]) == 2
    assert error_line(capsys) == f"rttsched select: error: {said.format(tmp=tmp_path)}"


def test_a_json_report_at_a_fifo_is_refused_before_the_work(tmp_path, capsys):
    """Opening a FIFO to try it blocks until something reads it: refused as not a file, without opening it."""
    src = _write(tmp_path / "samples.csv", _samples())
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    assert main(["select", "--input", src, "--json", str(fifo)]) == 2
    assert error_line(capsys) == f"rttsched select: error: --json: {fifo} is not a file, where a file is written"


def test_the_json_report_over_the_input_is_refused(tmp_path, capsys):
    src = _write(tmp_path / "samples.csv", _samples())
    assert main(["select", "--input", src, "--json", src]) == 2
    assert error_line(capsys) == f"rttsched select: error: --json: {src} is the --input file"
    assert Path(src).read_text().startswith("app,x,noise,rtt_ms\n")


def test_a_directory_as_input_is_said_to_be_one(tmp_path, capsys):
    assert main(["select", "--input", str(tmp_path)]) == 2
    assert error_line(capsys) == f"rttsched select: error: {tmp_path}: is a directory, not a file"


def test_a_missing_input_is_still_no_such_file(tmp_path, capsys):
    assert main(["select", "--input", str(tmp_path / "none.csv")]) == 2
    assert error_line(capsys) == f"rttsched select: error: {tmp_path / 'none.csv'}: no such file"
