"""RTT figures over the first and the second half of a run's tasks (models learn in the first half).

A learning policy's whole-run figures carry its warm-up; the second half says where it ends up. Tasks are
halved in submission order, so every policy of a seed is split at the same task.

>>> import numpy as np
>>> from types import SimpleNamespace
>>> run = SimpleNamespace(apps=("a",) * 4, rtt_ms=np.array([400.0, 200.0, 100.0, 50.0]), ok=np.ones(4, bool))
>>> half_figures(run, "second")["mean_rtt_ms"], half_figures(run, "first")["mean_rtt_ms"]
(75.0, 300.0)
>>> seed_means([run, run], "second")["mean_rtt_ms"]
75.0
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

RTT_FIGURES = ("mean_rtt_ms", "p50_rtt_ms", "p95_rtt_ms", "p99_rtt_ms", "rtt_std_ms")
PARTS = ("all", "first", "second")


def half_mask(n: int, which: str) -> np.ndarray:
    """Tasks of the ``first`` or ``second`` half (submission order) of ``n`` tasks, or ``all`` of them."""
    if which not in PARTS:
        raise ValueError(f"half_mask.which: must be one of {', '.join(PARTS)} (got {which!r})")
    if which == "all":
        return np.ones(n, dtype=bool)
    late = np.arange(n) >= n // 2
    return late if which == "second" else ~late


def half_figures(run: Any, which: str) -> dict[str, float]:
    """Mean, p50, p95, p99 and standard deviation of RTT (ms) over the completed tasks of one half (or all)."""
    rtt = run.rtt_ms[run.ok & half_mask(len(run.apps), which)]
    if not rtt.size:
        return dict.fromkeys(RTT_FIGURES, math.nan)
    p50, p95, p99 = np.percentile(rtt, [50, 95, 99]).tolist()
    return {"mean_rtt_ms": float(rtt.mean()), "p50_rtt_ms": p50, "p95_rtt_ms": p95, "p99_rtt_ms": p99,
            "rtt_std_ms": float(rtt.std())}


def seed_means(runs: Sequence[Any], which: str) -> dict[str, float]:
    """:func:`half_figures` averaged over the seeds' runs (NaN where none has a value)."""
    per_seed = [half_figures(r, which) for r in runs]
    out = {}
    for f in RTT_FIGURES:
        vals = [s[f] for s in per_seed if math.isfinite(s[f])]
        out[f] = float(np.mean(vals)) if vals else math.nan
    return out
