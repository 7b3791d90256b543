"""``rttsched settings``: every setting, its value in force, where it came from and what it does."""

from __future__ import annotations

import argparse
import shutil
import textwrap

import orjson

from app.config import SettingRow, Settings

HELP = "list every RTT_* setting: value in force, source (environment or default) and description"

MAX_WIDTH = 100


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON array instead of the table")


def table(rows: list[SettingRow], width: int = MAX_WIDTH) -> list[str]:
    """Aligned columns; the description wraps under itself so that no line is wider than ``width``.

    >>> rows = [SettingRow("RTT_A", "1.0", "default", "a setting whose description is long enough to wrap")]
    >>> for line in table(rows, width=50): print(line.rstrip())
    VARIABLE  VALUE  SOURCE   DESCRIPTION
    RTT_A     1.0    default  a setting whose description
                              is long enough to wrap
    """
    head = ("VARIABLE", "VALUE", "SOURCE")
    cells = [(r.variable, r.value or "''", r.source) for r in rows]  # an empty value shown as ''
    cols = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    lead = sum(cols) + 2 * len(cols)
    doc_width = max(width - lead, 20)
    out = ["  ".join(h.ljust(w) for h, w in zip(head, cols, strict=True)) + "  DESCRIPTION"]
    for r, row in zip(rows, cells, strict=True):
        lead_text = "  ".join(v.ljust(w) for v, w in zip(row, cols, strict=True)) + "  "
        wrapped = textwrap.wrap(r.doc, doc_width) or [""]
        out.append(lead_text + wrapped[0])
        out.extend(" " * lead + more for more in wrapped[1:])
    return out


def run(args: argparse.Namespace, settings: Settings) -> int:
    from app.streams.options import WorkerOptions

    # what the worker checks of them at its start (a feature history as long as its windows, ...), without the
    # flags (--history-s) that may change them there: refused here as there, one line naming the variable
    WorkerOptions.from_settings(settings)
    rows = settings.listing()
    if args.json:
        print(orjson.dumps([r.__dict__ for r in rows], option=orjson.OPT_INDENT_2).decode())
        return 0
    width = min(MAX_WIDTH, shutil.get_terminal_size((MAX_WIDTH, 24)).columns)
    print("\n".join(table(rows, width)))
    return 0
