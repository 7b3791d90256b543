"""What ``rttsched sim`` and ``rttsched demo`` print: a summary within 100 columns; everything else is in the report.

Progress bars are capped at the same width (:func:`bar_width`), so no line of either command wraps in a
100-column terminal.

>>> agg = {"kube_default": {"mean_rtt_ms": {"mean": 151.0, "ci95": 0.0, "n": 1.0}}}
>>> lines = summary_lines(agg, [])
>>> lines[0].split(), lines[-1]
(['policy', 'mean', 'RTT', 'ms', 'p95', 'ms', 'p99', 'ms', 'SLA', 'met', 'GPU', 'busy', 'tasks/s'], \
'one seed: means only, no confidence interval (run two or more seeds for one)')
>>> fit("x" * 120)[-3:], len(fit("x" * 120))
('...', 100)
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

WIDTH = 100


def bar_width() -> int:
    """Columns for a progress bar: the terminal's width, at most :data:`WIDTH`."""
    return min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns)


def fit(line: str, width: int = WIDTH) -> str:
    """``line`` cut to ``width`` columns (with ``...``) when longer."""
    return line if len(line) <= width else line[: width - 3] + "..."


def summary_lines(agg: Mapping[str, Any], goals: Sequence[Mapping[str, Any]]) -> list[str]:
    """The policy table (seed means; intervals from two seeds; ``failed`` when tasks failed, with a warning
    line), the interval note and the goals, each line within :data:`WIDTH` (a table too wide goes on in a
    second block)."""
    from app.sim.report import format_goals, format_table, interval_note
    from app.sim.report.tables import failed_note, terminal_figures

    lines = [*format_table(agg, terminal_figures(agg), WIDTH).splitlines(), interval_note(agg)]
    if warning := failed_note(agg, WIDTH):
        lines.append(warning)
    if goals:
        lines += ["", *format_goals(goals).splitlines()]
    return [fit(line) for line in lines]


def output_lines(out: Path, html: bool) -> list[str]:
    """Where the report went (the one path on its own line), and the other files beside it, each named once.

    >>> output_lines(Path("out"), html=False)
    ['report: out/policies.json', '        beside it: policies.csv (the table)']
    """
    if not html:
        return [f"report: {out / 'policies.json'}", "        beside it: policies.csv (the table)"]
    return [f"report: {out / 'report.html'}",
            "        beside it: policies.csv (the table), policies.json (every figure and run)"]


def live_lines(live: Mapping[str, Any], halves: Mapping[str, Sequence[float]], live_name: str,
               accuracy: Mapping[str, Mapping[str, float]]) -> list[str]:
    """The live run: what the extender and the feedback loop did, mean RTT by half, accuracy by half.

    ``halves``: per policy (mean over all tasks, first half, second half); ``accuracy``: per row, 1 - MAPE
    per ``app:class`` over the second half.
    """
    from app.sim.report.stats import ratio

    ext = {k: live["extender"].get(k, 0) for k in ("requests", "scored", "neutral", "errors", "bound", "filtered_out")}
    # every attempt ends one way: prioritize scored or neutral, an error (default scoring), bound after filter alone
    # (one node passed), or left pending (none passed)
    w = max([16, *(len(p) + 1 for p in halves)])  # the name column: the longest name and a space
    lines = [f"live: {ext['requests']:.0f} placement attempts: {ext['scored']:.0f} scored, "
             f"{ext['neutral']:.0f} neutral, {ext['errors']:.0f} errors,",
             f"      {ext['bound']:.0f} bound by filter alone (one node passed), "
             f"{ext['filtered_out']:.0f} left pending (none passed)",
             f"      {live['retrain_events']} retrain events, {live['model_updates']} model updates, "
             f"{live['predictions_joined']} predictions joined",
             f"  {'mean RTT ms':<{w}}{'all tasks':>10}{'1st half':>10}{'2nd half':>10}   live vs row, 2nd half"]
    for p, (whole, first, second) in halves.items():
        r = "" if p == live_name else f"{ratio(halves[live_name][2], second):+.1%}"
        lines.append(f"  {p:<{w}}{whole:>10.1f}{first:>10.1f}{second:>10.1f}   {r}")
    keys = sorted({k for a in accuracy.values() for k in a})
    if keys:
        lines.append(f"  {'1 - MAPE, 2nd half':<20}" + "".join(f"{p:>17}" for p in accuracy))
        for k in keys:
            lines.append(f"  {k:<20}" + "".join(f"{accuracy[p].get(k, float('nan')):>17.3f}" for p in accuracy))
    return [fit(line) for line in lines]
