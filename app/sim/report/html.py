"""The HTML report: tables and plots (base64 PNG) in one self-contained file."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from app.sim.report import plots
from app.sim.report.tables import LABELS, TABLE_FIGURES, Agg, accuracy_keys, goal_rows
from app.sim.results import RunMetrics


def _img(png: bytes, alt: str) -> str:
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">' \
           f"<figcaption>{html.escape(alt)}</figcaption></figure>"


def _cell(d: Mapping[str, float] | None) -> str:
    if not d or not math.isfinite(d["mean"]):
        return "<td>-</td>"
    return f"<td>{d['mean']:.4g} ± {d['ci95']:.3g}</td>"


def _table(agg: Agg, figures: Sequence[str]) -> str:
    head = "".join(f"<th>{html.escape(LABELS.get(f, f))}</th>" for f in figures)
    rows = "".join(f"<tr><th>{html.escape(p)}</th>{''.join(_cell(figs.get(f)) for f in figures)}</tr>"
                   for p, figs in agg.items())
    return f"<table><tr><th>policy</th>{head}</tr>{rows}</table>"


def render(agg: Agg, first_seed: Mapping[str, RunMetrics], config: Mapping[str, Any], seeds: Sequence[int]) -> str:
    """The whole report as one HTML string (plots from the first seed's runs)."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>rttsched simulator report</title><style>"
        "body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;font-size:13px}"
        "figure{display:inline-block;margin:0.5em}img{max-width:100%}</style></head><body>",
        "<h1>Simulated policy comparison</h1>",
        f"<p>Seeds {html.escape(', '.join(map(str, seeds)))}; mean ± 95 % confidence interval over seeds.</p>",
        f"<pre>{html.escape(repr(dict(config)))}</pre>",
        "<h2>Policies</h2>", _table(agg, TABLE_FIGURES),
    ]
    goals = goal_rows(agg, closed_loop=config.get("arrivals") == "closed")
    if goals:
        rows = "".join(f"<tr><td>{g['figure']}</td><td>{g['policy']} vs {g['baseline']}</td>"
                       f"<td>{g['change']:+.1%}</td><td>{g['goal']:+.0%}</td>"
                       f"<td>{'yes' if g['met'] else 'no'}</td></tr>"
                       for g in goals)
        parts.append("<h2>Goals</h2><table><tr><th>figure</th><th>comparison</th><th>change</th><th>goal</th>"
                     f"<th>met</th></tr>{rows}</table>")
    acc = accuracy_keys(agg)
    if acc:
        parts += ["<h2>Prediction accuracy (1 − MAPE, after warm-up)</h2>", _table(agg, acc)]
    parts.append("<h2>Plots (first seed)</h2>")
    parts.append(_img(plots.rtt_distributions(first_seed), "RTT distribution per policy"))
    for name, run in first_seed.items():
        if not run.trace.predicted_ms or name == "clairvoyant":
            continue
        parts.append(f"<h3>{html.escape(name)}</h3>")
        parts.append(_img(plots.predicted_vs_actual(run), f"{name}: predicted vs observed RTT"))
        if run.trace.errors:
            parts.append(_img(plots.error_over_time(run), f"{name}: error over time, retrains marked"))
        if run.trace.weights:
            parts.append(_img(plots.lines_over_time(run.trace.weights, f"{name}: node weights (credibility)",
                                                    "credibility"), f"{name}: node weights over time"))
        if run.trace.windows:
            parts.append(_img(plots.lines_over_time(run.trace.windows, f"{name}: DWA windows (node:app)",
                                                    "window (s)"), f"{name}: DWA window sizes over time"))
    parts.append("</body></html>")
    return "\n".join(parts)
