"""Reports of policy comparisons: :func:`write_report` writes CSV, JSON and a self-contained HTML file.

Entry point for every caller (CLI, bench, a live run)::

    paths = write_report({"clairvoyant": [run_seed1, run_seed2, ...], ...}, "reports/sim", config)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from app.sim.report.stats import aggregate, mean_ci
from app.sim.report.tables import format_goals, format_table, goal_rows, to_csv
from app.sim.results import RunMetrics


@dataclasses.dataclass(frozen=True)
class ReportPaths:
    csv: Path
    json: Path
    html: Path


def summarise(runs: Mapping[str, Sequence[RunMetrics]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per policy and figure: mean and 95 % CI over the seeds' :meth:`RunMetrics.summary`."""
    return aggregate({p: [r.summary() for r in rs] for p, rs in runs.items()})


def write_report(runs: Mapping[str, Sequence[RunMetrics]], out_dir: str | Path,
                 config: Mapping[str, Any] | None = None, *, html: bool = True) -> ReportPaths:
    """Write ``policies.csv``, ``policies.json`` and ``report.html`` under ``out_dir``."""
    from app.sim.report.html import render

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    agg = summarise(runs)
    seeds = sorted({r.seed for rs in runs.values() for r in rs})
    paths = ReportPaths(out / "policies.csv", out / "policies.json", out / "report.html")
    paths.csv.write_text(to_csv(agg))
    closed = dict(config or {}).get("arrivals") == "closed"
    doc = {
        "config": dict(config or {}), "seeds": seeds, "policies": agg, "goals": goal_rows(agg, closed_loop=closed),
        "runs": {p: [{"seed": r.seed, **r.summary(), "fingerprint": r.fingerprint(),
                      "selections": r.trace.notes.get("selections", {})} for r in rs] for p, rs in runs.items()},
    }
    paths.json.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    if html:
        first = {p: rs[0] for p, rs in runs.items() if rs}
        paths.html.write_text(render(agg, first, dict(config or {}), seeds))
    return paths


__all__ = ["ReportPaths", "format_goals", "format_table", "goal_rows", "mean_ci", "summarise", "write_report"]
