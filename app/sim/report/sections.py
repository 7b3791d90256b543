"""The report's tables as HTML: verdict, policies, goals, retrains, config and the metric definitions.

Every function returns an HTML fragment with its text escaped; numbers come from the same cells as the
terminal's table (:func:`app.sim.report.tables.cell`), so an interval appears only with two or more seeds.
"""

from __future__ import annotations

import html
import math
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

from app.sim.report.definitions import DEFINITIONS, POLICIES, label
from app.sim.report.goals import Agg
from app.sim.report.halves import seed_means
from app.sim.report.plots_learning import REASON_TEXT, reason_kind
from app.sim.report.stats import ratio
from app.sim.report.tables import cell

VERDICT = (("mean_rtt_ms", "all", "mean"), ("p50_rtt_ms", "all", "median"), ("p95_rtt_ms", "all", "p95"),
           ("p99_rtt_ms", "all", "p99"), ("mean_rtt_ms", "second", "mean, 2nd half"),
           ("p95_rtt_ms", "second", "p95, 2nd half"))


def esc(x: object) -> str:
    return html.escape(str(x))


def _change(v: float) -> str:
    if not math.isfinite(v):
        return "<td>-</td>"
    kind = "better" if v < -0.005 else "worse" if v > 0.005 else "same"
    return f'<td class="{kind}">{v:+.1%}</td>'


def verdict_table(runs: Mapping[str, Sequence[Any]], rows: Sequence[str]) -> str:
    """Each scored row against every other policy: change of mean, median and tails, over all tasks and after
    warm-up (the second half); negative = the row is faster."""
    figs = {p: {w: seed_means(rs, w) for w in ("all", "second")} for p, rs in runs.items() if rs}
    head = "".join(f"<th>{esc(t)}</th>" for _, _, t in VERDICT)
    body = []
    for row in rows:
        for other in figs:
            if other == row:
                continue
            cells = "".join(_change(ratio(figs[row][w][f], figs[other][w][f])) for f, w, _ in VERDICT)
            body.append(f"<tr><th>{esc(row)}</th><th>{esc(other)}</th>{cells}</tr>")
    return f'<table class="verdict"><tr><th>row</th><th>against</th>{head}</tr>{"".join(body)}</table>'


def percentile_table(runs: Mapping[str, Sequence[Any]]) -> str:
    """p50, p95 and p99 of RTT per policy (seed means), the numbers marked on the CDF."""
    body = []
    for p, rs in runs.items():
        f = seed_means(rs, "all")
        body.append(f"<tr><th>{esc(p)}</th>" + "".join(f"<td>{f[k]:.1f}</td>" if math.isfinite(f[k]) else "<td>-</td>"
                                                         for k in ("p50_rtt_ms", "p95_rtt_ms", "p99_rtt_ms")) + "</tr>")
    return f"<table><tr><th>policy</th><th>p50 ms</th><th>p95 ms</th><th>p99 ms</th></tr>{''.join(body)}</table>"


def policy_table(agg: Agg, figures: Sequence[str], live: Collection[str], *, rates: bool = True) -> str:
    """Every figure per policy; with ``rates``, the wall-clock rate in two columns: live pace (live rows) and
    simulator speed (offline rows)."""
    cols = [*figures, "live_pace", "sim_speed"] if rates else list(figures)
    head = "".join(f'<th title="{esc(DEFINITIONS.get(f, ""))}">{esc(label(f))}</th>' for f in cols)
    body = []
    for p, figs in agg.items():
        wall = figs.get("tasks_per_wall_s")
        pace, speed = (wall, None) if p in live else (None, wall)
        cells = [cell(figs.get(f), f) for f in figures]
        if rates:
            cells += [cell(pace, "live_pace"), cell(speed, "sim_speed")]
        body.append(f"<tr><th>{esc(p)}</th>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    return f"<table><tr><th>policy</th>{head}</tr>{''.join(body)}</table>"


def goals_table(goals: Sequence[Mapping[str, Any]]) -> str:
    """Figure, the row it is scored on, baseline, change, goal, met, and why a missed goal is missed."""
    body = []
    for g in goals:
        met = '<td class="better">yes</td>' if g["met"] else '<td class="worse">no</td>'
        change = f"{g['change']:+.1%}" if math.isfinite(g["change"]) else "-"  # a row that completed no task
        body.append(f"<tr><td>{esc(label(g['figure']))}</td><th>{esc(g['row'])}</th><td>{esc(g['baseline'])}</td>"
                    f"<td>{change}</td><td>{g['goal']:+.0%}</td>{met}"
                    f'<td class="why">{esc(g["why"])}</td></tr>')
    return ('<table class="goals"><tr><th>figure</th><th>scored on row</th><th>baseline</th><th>change</th>'
            f"<th>goal</th><th>met</th><th>why not</th></tr>{''.join(body)}</table>")


def retrain_table(retrains: Sequence[tuple[float, str, str]], limit: int = 25) -> str:
    """The retrains in time order: when, which model, why (the first ``limit``, then a count)."""
    rows = []
    for t, key, reason in retrains[:limit]:
        kind = reason_kind(reason)
        why = REASON_TEXT.get(kind, kind) + ("" if reason == kind else f" ({reason})")
        rows.append(f'<tr><td>{t:.1f}</td><td>{esc(key)}</td><td>{esc(kind)}</td><td class="why">{esc(why)}</td></tr>')
    more = f"<p>… and {len(retrains) - limit} more retrains.</p>" if len(retrains) > limit else ""
    return ("<table><tr><th>simulated s</th><th>model</th><th>kind</th><th>why</th></tr>"
            f"{''.join(rows)}</table>{more}")


def _flat(prefix: str, value: Any) -> Iterator[tuple[str, str]]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _flat(f"{prefix}.{k}" if prefix else str(k), v)
    elif isinstance(value, list | tuple) and value and all(isinstance(v, Mapping) for v in value):
        for i, v in enumerate(value):
            yield from _flat(f"{prefix}[{i}]", v)
    elif isinstance(value, list | tuple):
        yield prefix, ", ".join(map(str, value)) or "-"
    else:
        yield prefix, "-" if value is None else str(value)


def config_table(config: Mapping[str, Any]) -> str:
    """The run's configuration, one setting a row (nested values under dotted names)."""
    rows = "".join(f'<tr><th>{esc(k)}</th><td class="text">{esc(v)}</td></tr>' for k, v in _flat("", config))
    return f'<table class="config"><tr><th>setting</th><th>value</th></tr>{rows}</table>'


def definitions(policies: Collection[str] = ()) -> str:
    """Each of ``policies`` (the report's rows; a live row is its policy run live), then each figure's
    definition, as description lists."""
    rows = "".join(f"<dt>{esc(p)}</dt><dd>{esc(POLICIES[p.removesuffix('_live')])}"
                   f"{' Run live against the real system.' if p.endswith('_live') else ''}</dd>"
                   for p in policies if p.removesuffix("_live") in POLICIES)
    items = "".join(f"<dt>{esc(label(k))}</dt><dd>{esc(v)}</dd>" for k, v in DEFINITIONS.items())
    return (f'<dl class="definitions">{rows}</dl>' if rows else "") + f'<dl class="definitions">{items}</dl>'
