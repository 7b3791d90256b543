"""Every setting is documented outside ``rttsched settings``: named in the README or a page of docs/, and the
settings tables of docs/worker.md and docs/feedback.md give each variable the default app.config has; the
README's links to those tables reach a heading. RTT_FEATURE_HISTORY_S, RTT_WORKER_DATADIR, RTT_TRAINER_MARGIN and
five more were named nowhere but in ``rttsched settings``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from app.config import Settings

REPO = Path(__file__).resolve().parents[3]
DOCS = sorted((REPO / "docs").glob("*.md"))
README = REPO / "README.md"
TABLES = (REPO / "docs" / "worker.md", REPO / "docs" / "feedback.md")  # each with a "## Settings" section


def _defaults() -> dict[str, object]:
    return {name: ast.literal_eval(default) for name, default, _doc in Settings.describe()}


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading.

    >>> anchor("Running pods per node: `rttsched pods`")
    'running-pods-per-node-rttsched-pods'
    """
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def _rows(path: Path) -> list[tuple[str, str]]:
    """(variable, default cell) of each row of the settings tables of ``path``'s Settings section."""
    rows = []
    for line in _section(path.read_text(encoding="utf-8"), "## Settings").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| `") else []
        if cells:
            names = re.findall(r"`((?:RTT_|REDIS_)[A-Z0-9_]+)`", cells[0])
            assert len(names) == 1, f"{path.name}: a row names one variable: {line!r}"
            rows.append((names[0], cells[1]))
    return rows


def _value(cell: str) -> object:
    """A default cell as a value: `var/faust` -> 'var/faust', 86,400 -> 86400.0, (empty) -> ''."""
    cell = cell.strip("`")
    if cell == "(empty)":
        return ""
    try:
        return float(cell.replace(",", ""))
    except ValueError:
        return cell


def test_every_setting_is_named_in_the_readme_or_the_docs():
    text = README.read_text(encoding="utf-8") + "".join(p.read_text(encoding="utf-8") for p in DOCS)
    missing = [name for name in _defaults() if not re.search(rf"\b{name}\b", text)]
    assert not missing, f"settings named in neither README.md nor docs/: {missing}"


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.name)
def test_a_settings_table_gives_each_variable_its_default(path):
    defaults = _defaults()
    rows = _rows(path)
    assert len(rows) >= 10
    for name, cell in rows:
        assert name in defaults, f"{path.name}: {name} is no setting of app.config"
        want, got = defaults[name], _value(cell)
        if isinstance(want, int | float):
            assert got == float(want), f"{path.name}: {name}: the table says {cell}, app.config {want!r}"
        else:
            assert got == want, f"{path.name}: {name}: the table says {cell}, app.config {want!r}"


def test_the_settings_tables_name_each_variable_once():
    names = [name for path in TABLES for name, _cell in _rows(path)]
    assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)


def test_the_readme_s_links_into_the_docs_reach_a_heading():
    links = re.findall(r"\]\((docs/[\w.-]+\.md)#([\w-]+)\)", README.read_text(encoding="utf-8"))
    assert ("docs/worker.md", "settings") in links and ("docs/feedback.md", "settings") in links
    for doc, section in links:
        headings = re.findall(r"^#{1,6} (.*)$", (REPO / doc).read_text(encoding="utf-8"), flags=re.M)
        assert section in {anchor(h) for h in headings}, f"README.md links {doc}#{section}, no such heading"
