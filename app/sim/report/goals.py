"""The goals, measured on named rows, and one line on why each missed goal is missed.

A goal compares a *row* (the offline ``rtt_aware`` and, in the demo, the live ``rtt_aware_live``) with a
*baseline* on a figure's seed mean. A missed goal gets a reason built from the run's own numbers:

- the *reference*: what the clairvoyant (true service times, no learning; a strong reference that ranks by
  RTT alone, not a bound: a policy can beat it, and on figures other than RTT it may not even try) gets
  against the same baseline;
- the *second half*: the row's change over the tasks from the half-way point on (RTT figures only, when
  the runs are at hand).

>>> agg = {"rtt_aware": {"mean_rtt_ms": {"mean": 90.0}}, "kube_default": {"mean_rtt_ms": {"mean": 100.0}},
...        "clairvoyant": {"mean_rtt_ms": {"mean": 80.0}}}
>>> row = goal_rows(agg)[0]
>>> row["row"], row["baseline"], round(row["change"], 3), row["met"]
('rtt_aware', 'kube_default (best)', -0.1, False)
>>> row["why"]
'the clairvoyant gets -20.0 % against kube_default: the row is half-way to it'
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from app.sim.report.stats import ratio

Agg = Mapping[str, Mapping[str, Mapping[str, float]]]
BEST = "best baseline"  # the baseline with the best seed mean of the figure
REFERENCE = "clairvoyant"
GOALS = (  # (figure, policy, baseline, goal as relative change; negative = must drop by at least that)
    ("mean_rtt_ms", "rtt_aware", BEST, -0.15),
    ("p99_rtt_ms", "rtt_aware", BEST, -0.25),
    ("throughput", "rtt_aware", BEST, 0.15),
    ("mean_rtt_ms", "rtt_aware", "kube_default", -0.37),
    ("gpu_util", "rtt_aware", "kube_default", 0.28),
    ("rtt_std_ms", "rtt_aware", "kube_default", -0.60),
    ("load_diff", "rtt_aware", "kube_default", -0.64),
    ("mean_rtt_ms", "rtt_aware", REFERENCE, 0.10),
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


def _met(change: float, goal: float, baseline: str) -> bool:
    return bool(change <= goal) if (goal < 0 or baseline == REFERENCE) else bool(change >= goal)


def _why(agg: Agg, fig: str, row: str, base: str, goal: float, second: Mapping[str, Mapping[str, float]]) -> str:
    """One line on why ``row`` misses ``goal`` against ``base`` (see the module docstring)."""
    change = ratio(agg[row][fig]["mean"], agg[base][fig]["mean"])
    parts = []
    if base != REFERENCE and REFERENCE in agg and fig in agg[REFERENCE]:
        bound = ratio(agg[REFERENCE][fig]["mean"], agg[base][fig]["mean"])
        if math.isfinite(bound) and not _met(bound, goal, base):
            parts.append(f"the clairvoyant reference misses it too ({bound:+.1%} against {base})")
        elif math.isfinite(bound) and bound != 0 and change * bound > 0:
            share = change / bound
            how = "half-way" if 0.4 <= share <= 0.6 else f"{share:.0%} of the way"
            parts.append(f"the clairvoyant gets {bound:+.1%} against {base}: the row is {how} to it")
        elif math.isfinite(bound):
            parts.append(f"the row moves the figure the wrong way ({change:+.1%}); the clairvoyant gets {bound:+.1%}")
    if fig in second.get(row, {}) and fig in second.get(base, {}):
        late = ratio(second[row][fig], second[base][fig])
        if math.isfinite(late):
            verdict = "met there" if _met(late, goal, base) else "still missed"
            parts.append(f"second half of the tasks: {late:+.1%}, {verdict}")
    return "; ".join(parts).replace("%", " %") or "no reference row to compare with"


def goal_rows(agg: Agg, *, closed_loop: bool = False, live: Collection[str] = (),
              second_half: Mapping[str, Mapping[str, float]] | None = None) -> list[dict[str, Any]]:
    """The goals, measured: relative change of each scored row vs the baseline on the seed means.

    Rows: the goal's policy and every ``live`` row named after it (``rtt_aware_live``), live rows first.
    Throughput goals only for a closed loop (where throughput follows the placement). ``second_half``:
    per policy, :func:`app.sim.report.halves.seed_means` of the second half, for the reasons.
    """
    second = second_half or {}
    out = []
    for fig, pol, base, goal in GOALS:
        if fig == "throughput" and not closed_loop:
            continue
        name = best_baseline(agg, fig) if base == BEST else base
        rows = [r for r in live if r.startswith(pol) and r != pol] + [pol]
        for row in rows:
            if name is None or row not in agg or name not in agg or fig not in agg[row] or fig not in agg[name]:
                continue
            change = ratio(agg[row][fig]["mean"], agg[name][fig]["mean"])
            met = _met(change, goal, base)
            out.append({"figure": fig, "row": row, "policy": row, "baseline": f"{name} (best)" if base == BEST
                        else name, "change": change, "goal": goal, "met": met,
                        "why": "" if met else _why(agg, fig, row, name, goal, second)})
    return out


def format_goals(rows: Sequence[Mapping[str, Any]]) -> str:
    """Fixed-width text within 100 columns: figure, scored row, baseline, change, goal, met."""
    lines = [f"{'figure':<13}{'row':<16}{'vs baseline':<26}{'change':>9}{'goal':>8}  met"]
    for r in rows:
        change = f"{r['change']:+.1%}" if math.isfinite(r["change"]) else "-"  # a row that completed no task
        lines.append(f"{r['figure']:<13}{r['row']:<16}{r['baseline']:<26}{change:>9}"
                     f"{r['goal']:>+8.0%}  {'yes' if r['met'] else 'no'}")
    return "\n".join(lines)
