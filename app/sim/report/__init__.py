"""Reports of policy comparisons: :func:`write_report` writes CSV, JSON and a self-contained HTML file.

Entry point for every caller (CLI, bench, a live run)::

    paths = write_report({"clairvoyant": [run_seed1, run_seed2, ...], ...}, "reports/sim", config,
                         live={"rtt_aware_live"}, hardware=hardware_labels(sim_config))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from app.paths import cannot_write, not_a_file
from app.sim.report.goals import format_goals, goal_rows
from app.sim.report.halves import seed_means
from app.sim.report.stats import aggregate, mean_ci
from app.sim.report.tables import format_table, interval_note, to_csv
from app.sim.results import RunMetrics


@dataclasses.dataclass(frozen=True)
class ReportPaths:
    csv: Path
    json: Path
    html: Path


def summarise(runs: Mapping[str, Sequence[RunMetrics]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per policy and figure: mean and 95 % CI over the seeds' :meth:`RunMetrics.summary`."""
    return aggregate({p: [r.summary() for r in rs] for p, rs in runs.items()})


def hardware_labels(config: Any) -> dict[str, str]:
    """Node name -> its hardware in words (``RTX 4090``, ``CPU 32 cores``) for a :class:`SimConfig`'s nodes,
    joining nodes included.

    >>> from app.sim.runner import SimConfig
    >>> hardware_labels(SimConfig())["worker-3"], hardware_labels(SimConfig())["cpu-3"]
    ('RTX 4090', 'CPU 16 cores')
    """
    from app.sim.runner import build_events, build_nodes

    nodes, _ = build_events(config, build_nodes(config, 1.0), 1.0)
    return {n.name: n.gpu_model or f"CPU {n.cpu_cores} cores" for n in nodes}


def _targets(out_dir: str | Path, html: bool) -> list[Path]:
    out = Path(out_dir)
    return [out / n for n in ("policies.csv", "policies.json", *(["report.html"] if html else []))]


def report_problem(out_dir: str | Path, *, html: bool = True) -> str | None:
    """What would stop :func:`write_report` under ``out_dir`` (itself checked by the caller): a directory where
    it writes a file, or an existing file or link it cannot write (read-only, a link to where no file can be).
    Checked before the runs, so that they do not fail at the end with the report half written.

    >>> report_problem("/nonexistent") is None
    True
    """
    for path in _targets(out_dir, html):
        if kind := not_a_file(path):
            return f"{path} is {kind}, where the report writes a file"
        if (path.exists() or path.is_symlink()) and (problem := cannot_write(path)):
            return problem
    return None


def write_report(runs: Mapping[str, Sequence[RunMetrics]], out_dir: str | Path,
                 config: Mapping[str, Any] | None = None, *, html: bool = True, live: Collection[str] = (),
                 hardware: Mapping[str, str] | None = None,
                 explained: Sequence[Mapping[str, Any]] = ()) -> ReportPaths:
    """Write ``policies.csv``, ``policies.json`` and ``report.html`` under ``out_dir``.

    ``live``: the rows that ran against the real system (the title and tables say so; goals are scored on
    them too). ``hardware``: node -> hardware, for the labels of the node plots. ``explained``: a few
    explain answers to show.
    """
    from app.sim.report.html import render

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = dict(config or {})
    agg = summarise(runs)
    seeds = sorted({r.seed for rs in runs.values() for r in rs})
    paths = ReportPaths(out / "policies.csv", out / "policies.json", out / "report.html")
    paths.csv.write_text(to_csv(agg))
    second = {p: seed_means(rs, "second") for p, rs in runs.items() if rs}
    doc = {
        "config": cfg, "seeds": seeds, "live_rows": sorted(live), "interval": interval_note(agg), "policies": agg,
        "goals": goal_rows(agg, closed_loop=cfg.get("arrivals") == "closed", live=live, second_half=second),
        "second_half": second, "hardware": dict(hardware or {}), "explained": list(explained),
        "runs": {p: [{"seed": r.seed, **r.summary(), "fingerprint": r.fingerprint(),
                      "selections": r.trace.notes.get("selections", {})} for r in rs] for p, rs in runs.items()},
    }
    paths.json.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    if html:
        paths.html.write_text(render(agg, runs, cfg, seeds, live=live, hardware=hardware, explained=explained))
    return paths


__all__ = ["ReportPaths", "format_goals", "format_table", "goal_rows", "hardware_labels",
           "interval_note", "mean_ci", "report_problem", "summarise", "write_report"]
