"""The policy table as text (the terminal's summary), CSV and JSON; the HTML report draws its own from the same cells.

A cell is the seed mean, with ``± half-width of the 95 % interval`` only when two or more seeds went into it:
one seed has no interval, and the table does not pretend it has a zero-width one.

>>> agg = {"clairvoyant": {"mean_rtt_ms": {"mean": 100.0, "ci95": 2.0, "n": 5.0}},
...        "random": {"mean_rtt_ms": {"mean": 180.0, "ci95": 0.0, "n": 1.0}}}
>>> print(format_table(agg, ["mean_rtt_ms"]))
policy         mean RTT ms
--------------------------
clairvoyant      100.0 ± 2
random               180.0
>>> interval_note(agg)
'mean over 1 to 5 seeds; ± is the half-width of the 95 % interval (2 or more seeds only)'
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence

from app.sim.report.definitions import LABELS, label

# the terminal's summary (failed tasks added when a run had any); every figure is in the report
TERMINAL_FIGURES = ("mean_rtt_ms", "p95_rtt_ms", "p99_rtt_ms", "sla", "gpu_util", "throughput")
TABLE_FIGURES = ("mean_rtt_ms", "p95_rtt_ms", "p99_rtt_ms", "rtt_std_ms", "queue_ms", "queue_p99_ms", "throughput",
                 "gpu_util", "gpu_demand", "load_diff", "load_std", "sla", "retrains")
TASK_FIGURES = ("tasks", "failed", "makespan_s")  # how many tasks ran and failed, how long the run was
APP_RTT = "mean_rtt_ms:"  # mean_rtt_ms:<app>
FRACTIONS = ("gpu_util", "gpu_demand", "sla")
Agg = Mapping[str, Mapping[str, Mapping[str, float]]]
__all__ = ["LABELS", "TABLE_FIGURES", "TASK_FIGURES", "TERMINAL_FIGURES", "app_keys", "cell", "failed_note",
           "format_table", "interval_note", "terminal_figures", "to_csv"]


def _fmt(v: float, key: str) -> str:
    if not math.isfinite(v):
        return "-"
    if key in FRACTIONS or key.startswith("acc:"):
        return f"{v:.3f}"
    return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.1f}"


def _fmt_ci(v: float, key: str) -> str:
    """The half-width with no more digits than it carries (two significant figures)."""
    if key in FRACTIONS or key.startswith("acc:"):
        return f"{v:.3f}"
    return f"{v:.2g}" if abs(v) < 99.5 else f"{v:.0f}"  # .2g prints 99.5 to 100 as 1e+02


def cell(d: Mapping[str, float] | None, key: str) -> str:
    """``mean`` or ``mean ± ci95`` (two or more seeds); ``-`` when there is no finite value."""
    if not d or not math.isfinite(d["mean"]):
        return "-"
    if d.get("n", 1.0) >= 2 and math.isfinite(d["ci95"]):
        return f"{_fmt(d['mean'], key)} ± {_fmt_ci(d['ci95'], key)}"
    return _fmt(d["mean"], key)


def format_table(agg: Agg, figures: Sequence[str] = TERMINAL_FIGURES, width: int | None = None) -> str:
    """Fixed-width text: one row per policy, one :func:`cell` per figure, columns as narrow as their cells.

    With ``width``, columns that would go past it continue in a block below (the policy column repeated),
    so no line is longer and no cell is cut.
    """
    names = [f"{p}" for p in agg]
    first = max([len("policy"), *map(len, names)]) + 2
    cols = [[cell(agg[p].get(f), f) for p in agg] for f in figures]
    widths = [max([len(label(f)), *map(len, c)]) + 2 for f, c in zip(figures, cols, strict=True)]
    blocks: list[list[int]] = [[]]
    used = first
    for j, w in enumerate(widths):
        if width is not None and blocks[-1] and used + w > width:
            blocks.append([])
            used = first
        blocks[-1].append(j)
        used += w
    out = []
    for block in blocks:
        head = f"{'policy':<{first}}" + "".join(f"{label(figures[j]):>{widths[j]}}" for j in block)
        lines = [head, "-" * len(head)]
        for i, policy in enumerate(agg):
            lines.append(f"{policy:<{first}}" + "".join(f"{cols[j][i]:>{widths[j]}}" for j in block))
        out.append("\n".join(lines))
    return "\n\n".join(out)


def _failed(agg: Agg) -> list[str]:
    return [p for p, figs in agg.items() if figs.get("failed", {}).get("mean", 0.0) > 0]


def terminal_figures(agg: Agg) -> tuple[str, ...]:
    """:data:`TERMINAL_FIGURES`, and ``failed`` when a policy's runs failed tasks."""
    return (*TERMINAL_FIGURES, "failed") if _failed(agg) else TERMINAL_FIGURES


def failed_note(agg: Agg, width: int | None = None) -> str:
    """One line when a policy's runs failed tasks (they never ran: every other figure leaves them out), else "".

    ``width``: the policies are named when the line fits in it, else counted.

    >>> failed_note({"random": {"failed": {"mean": 4.0, "n": 1.0}}, "clairvoyant": {"failed": {"mean": 0.0}}})
    'warning: tasks failed under random: the other figures are over the completed tasks only'
    """
    hit = _failed(agg)
    if not hit:
        return ""
    line = "warning: tasks failed under {}: the other figures are over the completed tasks only"
    named = line.format(", ".join(hit))
    return named if width is None or len(named) <= width else line.format(f"{len(hit)} policies")


def app_keys(agg: Agg) -> list[str]:
    """The per-app mean RTT figures (``mean_rtt_ms:<app>``) of any policy, sorted."""
    return sorted({k for figs in agg.values() for k in figs if k.startswith(APP_RTT)})


def interval_note(agg: Agg) -> str:
    """One line on how many seeds each mean has and when an interval is shown."""
    ns = sorted({int(d.get("n", 1)) for figs in agg.values() for d in figs.values()})
    if not ns or ns[-1] < 2:
        return "one seed: means only, no confidence interval (run two or more seeds for one)"
    seeds = f"{ns[0]} to {ns[-1]} seeds" if len(ns) > 1 else f"{ns[0]} seeds"
    return f"mean over {seeds}; ± is the half-width of the 95 % interval (2 or more seeds only)"


def accuracy_keys(agg: Agg) -> list[str]:
    return sorted({k for figs in agg.values() for k in figs if k.startswith("acc:")})


def to_csv(agg: Agg) -> str:
    """Long format: ``policy,figure,mean,ci95,n``; ``ci95`` is empty below two seeds (no interval), as in
    :func:`cell`."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["policy", "figure", "mean", "ci95", "n"])
    for policy, figs in agg.items():
        for f, d in figs.items():
            ci = repr(d["ci95"]) if d["n"] >= 2 and math.isfinite(d["ci95"]) else ""
            w.writerow([policy, f, repr(d["mean"]), ci, int(d["n"])])
    return buf.getvalue()
