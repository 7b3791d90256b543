"""RTT figures over a part of a run's tasks: the first or the second half (models learn in the first), or the
tasks submitted after a slowdown began.

A learning policy's whole-run figures carry its warm-up; the second half says where it ends up. Tasks are
halved in submission order, so every policy of a seed is split at the same task. A slowdown (a node that
loses speed and no metric shows it) starts at the same time in every policy's run of a seed, so the tasks
submitted from then on are the same tasks too: what adapting to it is worth.

>>> import numpy as np
>>> from types import SimpleNamespace
>>> run = SimpleNamespace(apps=("a",) * 4, rtt_ms=np.array([400.0, 200.0, 100.0, 50.0]), ok=np.ones(4, bool))
>>> half_figures(run, "second")["mean_rtt_ms"], half_figures(run, "first")["mean_rtt_ms"]
(75.0, 300.0)
>>> seed_means([run, run], "second")["mean_rtt_ms"]
75.0
>>> from app.sim.events import NodeEvent
>>> run.submit_s, run.events = np.array([0.0, 1.0, 2.0, 3.0]), (NodeEvent("slowdown", "gpu-1", 1.5),)
>>> slowdown_onset_s(run), part_figures(run, after_slowdown(run))["mean_rtt_ms"]
(1.5, 75.0)
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


def slowdown_onset_s(run: Any) -> float | None:
    """When the run's first slowdown event begins (seconds into the run); None when it has none."""
    starts = [e.start_s for e in run.events if e.kind == "slowdown"]
    return min(starts) if starts else None


def after_slowdown(run: Any) -> np.ndarray:
    """The tasks submitted at or after the run's first slowdown began (none when it has no slowdown)."""
    onset = slowdown_onset_s(run)
    return np.zeros(len(run.apps), dtype=bool) if onset is None else np.asarray(run.submit_s) >= onset


def half_figures(run: Any, which: str) -> dict[str, float]:
    """Mean, p50, p95, p99 and standard deviation of RTT (ms) over the completed tasks of one half (or all)."""
    return part_figures(run, half_mask(len(run.apps), which))


def part_figures(run: Any, mask: np.ndarray) -> dict[str, float]:
    """:func:`half_figures` over the tasks ``mask`` keeps (NaN for every figure when none completed)."""
    rtt = run.rtt_ms[run.ok & mask]
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
