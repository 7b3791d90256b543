"""The policy table: the seed's four figures, tails, queueing, throughput, SLA, accuracy, as text, CSV, JSON.

>>> agg = {"clairvoyant": {"mean_rtt_ms": {"mean": 100.0, "ci95": 2.0, "n": 5.0}}}
>>> print(format_table(agg, ["mean_rtt_ms"]).splitlines()[2])
clairvoyant     100.0 ± 2.0
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

from app.sim.report.stats import ratio

TABLE_FIGURES = ("mean_rtt_ms", "p95_rtt_ms", "p99_rtt_ms", "rtt_std_ms", "queue_ms", "throughput", "gpu_util",
                 "gpu_demand", "load_diff", "load_std", "sla", "retrains", "tasks_per_wall_s")
LABELS = {
    "mean_rtt_ms": "mean RTT ms", "p95_rtt_ms": "p95 ms", "p99_rtt_ms": "p99 ms", "rtt_std_ms": "RTT std ms",
    "queue_ms": "queue ms", "queue_p99_ms": "queue p99 ms", "throughput": "tasks/s", "gpu_util": "GPU busy",
    "gpu_demand": "GPU demand", "load_diff": "load diff pp", "load_std": "load std pp", "sla": "SLA met",
    "retrains": "retrains", "tasks_per_wall_s": "sim tasks/s wall",
}
FRACTIONS = ("gpu_util", "gpu_demand", "sla")
Agg = Mapping[str, Mapping[str, Mapping[str, float]]]


def _fmt(v: float, key: str) -> str:
    if not math.isfinite(v):
        return "-"
    if key in FRACTIONS or key.startswith("acc:"):
        return f"{v:.3f}"
    return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.1f}"


def format_table(agg: Agg, figures: Sequence[str] = TABLE_FIGURES) -> str:
    """Fixed-width text: one row per policy, ``mean ± ci95`` per figure."""
    head = f"{'policy':<14}" + "".join(f"{LABELS.get(f, f):>18}" for f in figures)
    lines = [head, "-" * len(head)]
    for policy, figs in agg.items():
        cells = []
        for f in figures:
            d = figs.get(f)
            cells.append(f"{_fmt(d['mean'], f) + ' ± ' + _fmt(d['ci95'], f) if d else '-':>18}")
        lines.append(f"{policy:<14}" + "".join(cells))
    return "\n".join(lines)


def accuracy_keys(agg: Agg) -> list[str]:
    return sorted({k for figs in agg.values() for k in figs if k.startswith("acc:")})


BEST = "best baseline"  # the baseline with the best seed mean of the figure
GOALS = (  # (figure, policy, baseline, goal as relative change; negative = must drop by at least that)
    ("mean_rtt_ms", "rtt_aware", BEST, -0.15),
    ("p99_rtt_ms", "rtt_aware", BEST, -0.25),
    ("throughput", "rtt_aware", BEST, 0.15),
    ("mean_rtt_ms", "rtt_aware", "kube_default", -0.37),
    ("gpu_util", "rtt_aware", "kube_default", 0.28),
    ("rtt_std_ms", "rtt_aware", "kube_default", -0.60),
    ("load_diff", "rtt_aware", "kube_default", -0.64),
    ("mean_rtt_ms", "rtt_aware", "clairvoyant", 0.10),
)
HIGHER_IS_BETTER = ("throughput", "gpu_util", "sla")


def best_baseline(agg: Agg, figure: str) -> str | None:
    """The baseline (not rtt_aware, not the clairvoyant) with the best seed mean of ``figure``."""
    from app.sim.policies import BASELINES

    have = [p for p in BASELINES if p in agg and figure in agg[p] and math.isfinite(agg[p][figure]["mean"])]
    if not have:
        return None
    pick = max if figure in HIGHER_IS_BETTER else min
    return pick(have, key=lambda p: agg[p][figure]["mean"])


def goal_rows(agg: Agg, *, closed_loop: bool = False) -> list[dict[str, Any]]:
    """The goals, measured: relative change of ``policy`` vs ``baseline`` on the seed means (throughput goals
    only for a closed loop, where throughput follows the placement)."""
    rows = []
    for fig, pol, base, goal in GOALS:
        if fig == "throughput" and not closed_loop:
            continue
        name = best_baseline(agg, fig) if base == BEST else base
        if name is None or pol not in agg or name not in agg or fig not in agg[pol] or fig not in agg[name]:
            continue
        r = ratio(agg[pol][fig]["mean"], agg[name][fig]["mean"])
        met = (r <= goal) if (goal < 0 or base == "clairvoyant") else (r >= goal)
        label = f"{name} (best)" if base == BEST else name
        rows.append({"figure": fig, "policy": pol, "baseline": label, "change": r, "goal": goal, "met": bool(met)})
    return rows


def format_goals(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = [f"{'figure':<13}{'policy vs baseline':<40}{'change':>9}{'goal':>8}  met"]
    for r in rows:
        lines.append(f"{r['figure']:<13}{r['policy'] + ' vs ' + r['baseline']:<40}{r['change']:>+9.1%}"
                     f"{r['goal']:>+8.0%}  {'yes' if r['met'] else 'no'}")
    return "\n".join(lines)


def to_csv(agg: Agg) -> str:
    """Long format: ``policy,figure,mean,ci95,n``."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["policy", "figure", "mean", "ci95", "n"])
    for policy, figs in agg.items():
        for f, d in figs.items():
            w.writerow([policy, f, repr(d["mean"]), repr(d["ci95"]), int(d["n"])])
    return buf.getvalue()
