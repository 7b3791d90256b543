"""The HTML report: one self-contained file (inline SVG plots, inline CSS, no script, nothing fetched).

Order: what was run (live or simulated), the verdict of the scored rows against every other policy, the RTT
distribution, RTT over time, every figure, the goals with the row each is scored on and why a goal is missed,
prediction accuracy, what the learning rows learned, placements explained, the config and the definitions.
"""

from __future__ import annotations

import html
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from app.sim.report import plots_learning, plots_rtt, sections
from app.sim.report.explain import explain_section
from app.sim.report.goals import Agg, goal_rows
from app.sim.report.halves import seed_means
from app.sim.report.tables import TABLE_FIGURES, TASK_FIGURES, accuracy_keys, app_keys, failed_note, interval_note
from app.sim.results import WARMUP_FRACTION

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1340px;padding:0 1em;color:#222}
h1{font-size:1.6em;margin-bottom:.2em} h2{margin-top:1.6em;border-bottom:1px solid #ddd}
p.lead{font-size:1.05em;margin-top:0}
table{border-collapse:collapse;margin:.8em 0;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f6f6f6} td.text,td.why{text-align:left;max-width:620px;overflow-wrap:anywhere}
td.better{background:#e3f4e3} td.worse{background:#f9e0e0}
table.config{max-width:100%} table.config th{text-align:left}
svg.plot{display:block;width:100%;height:auto;margin:.6em 0} svg.plot *{stroke-linejoin:round;stroke-linecap:butt}
dl.definitions dt{font-weight:bold;margin-top:.5em} dl.definitions dd{margin-left:1.5em}
.note{color:#555;font-size:.95em} .warning{color:#a40000;font-weight:bold}
"""


def _title(runs: Mapping[str, Sequence[Any]], live: Collection[str], config: Mapping[str, Any],
           seeds: Sequence[int]) -> tuple[str, str]:
    """(title, one paragraph on what is live and what is simulated)."""
    offline = [p for p in runs if p not in live]
    scenario = config.get("scenario")
    where = f" — scenario {scenario}" if scenario else ""
    seed_list = ", ".join(map(str, seeds))
    if live:
        names = ", ".join(sorted(live))
        return (f"{names} live against the real worker, trainer and extender; {len(offline)} policies simulated"
                f"{where}",
                f"Live rows ({names}): the simulated cluster ran in real time against the real system (broker, "
                "worker, trainer, extender over HTTP); every placement was asked of the extender, and where it had no "
                "fresh data its neutral answer left the pod to Kubernetes' default scoring (live.extender.neutral "
                "in the Configuration). Simulated rows ("
                f"{', '.join(offline)}): the offline simulator on the same workload and seed {seed_list}.")
    return (f"Simulated policy comparison{where}: {len(offline)} policies, {len(seeds)} seed(s)",
            f"Every row ran offline in the discrete-event simulator (seeds {seed_list}); no row is live.")


def _times(run: Any) -> tuple[float, float]:
    """(end of warm-up, start of the second half) in simulated seconds: submit times of those tasks."""
    n = len(run.apps)
    t = run.submit_s
    return float(t[min(int(WARMUP_FRACTION * n), n - 1)]), float(t[min(n // 2, n - 1)])


def _learning(name: str, run: Any, hardware: Mapping[str, str], k: int, live: bool) -> list[str]:
    tr = run.trace
    if not (tr.errors or tr.retrains or tr.weights or tr.windows):
        return []  # predictions only (a static table): the scatter above says it all
    out = [f"<h3>{html.escape(name)}</h3>"]
    if run.trace.errors or run.trace.retrains:
        out.append(plots_learning.error_over_time(run, name, f"err{k}"))
    if run.trace.retrains:
        out += ["<p>Every retrain, and why:</p>", sections.retrain_table(run.trace.retrains)]
    if run.trace.weights:
        out.append(plots_learning.node_weights(run, name, hardware, f"w{k}"))
    if run.trace.windows:
        out.append(plots_learning.dwa_windows(run, name, f"dwa{k}"))
    elif live:
        out.append(f'<p class="note">{html.escape(name)}: no DWA windows here (the live run sees what the worker '
                   "publishes: errors, weights, retrains; the windows stay inside the worker).</p>")
    return out


def render(agg: Agg, runs: Mapping[str, Sequence[Any]], config: Mapping[str, Any], seeds: Sequence[int], *,
           live: Collection[str] = (), hardware: Mapping[str, str] | None = None,
           explained: Sequence[Mapping[str, Any]] = ()) -> str:
    """The whole report as one HTML string; plots over time and learning plots use each row's first seed."""
    hw = dict(hardware or {})
    title, lead = _title(runs, live, config, seeds)
    scored = [p for p in runs if p in live] + [p for p in ("rtt_aware",) if p in runs]
    first = {p: rs[0] for p, rs in runs.items() if rs}
    which_seed = f" (seed {seeds[0]}, the first of {len(seeds)})" if len(seeds) > 1 else ""
    second = {p: seed_means(rs, "second") for p, rs in runs.items() if rs}
    parts = [
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>", f'<p class="lead">{html.escape(lead)}</p>',
        f'<p class="note">{html.escape(interval_note(agg))}.</p>',
    ]
    if warning := failed_note(agg):
        parts.append(f'<p class="warning">{html.escape(warning[:1].upper() + warning[1:])}.</p>')
    if scored:
        parts += ["<h2>Verdict: change of RTT against each policy</h2>",
                  '<p class="note">Row ÷ other − 1 on seed means; green: the row is faster. "2nd half": the tasks '
                  "from the half-way point on (the warm-up shaded below is the first 20 %).</p>",
                  sections.verdict_table(runs, scored)]
    parts += ["<h2>RTT distribution</h2>", plots_rtt.rtt_cdf(runs, scored, "cdf"), sections.percentile_table(runs)]
    if first:
        ref = first[scored[0]] if scored else next(iter(first.values()))
        warm, half = _times(ref)
        parts += [f"<h2>RTT over time{which_seed}</h2>", plots_rtt.over_time(first, scored, warm, half, "time")]
    parts += ["<h2>Every figure</h2>", sections.policy_table(agg, TABLE_FIGURES, live),
              sections.policy_table(agg, [*TASK_FIGURES, *app_keys(agg)], (), rates=False)]
    goals = goal_rows(agg, closed_loop=config.get("arrivals") == "closed", live=live, second_half=second)
    if goals:
        parts += ["<h2>Goals</h2>", sections.goals_table(goals)]
    acc = accuracy_keys(agg)
    if acc:
        parts += ["<h2>Prediction accuracy (1 − MAPE after the warm-up: from 20 % of the tasks on)</h2>",
                  sections.policy_table(agg, acc, (), rates=False)]
    learners = {p: first[p] for p in [*scored, *first] if p in first and p != "clairvoyant"
                and np.isfinite(first[p].predicted_ms).any()}  # the scored rows first
    if learners:
        parts += [f"<h2>What the learning rows learned{which_seed}</h2>",
                  plots_learning.predicted_vs_observed(learners, "pvo")]
        for k, (name, run) in enumerate(learners.items()):
            parts += _learning(name, run, hw, k, name in live)
    if explained:
        parts += ["<h2>Placements explained</h2>", explain_section(explained, hw)]
    shown = {**config, "nodes": [f"{n} · {h}" for n, h in hw.items()]} if hw else config
    parts += ["<h2>Configuration</h2>", sections.config_table(shown),
              "<h2>Definitions</h2>", sections.definitions(list(runs)), "</body></html>"]
    return "\n".join(parts)
