"""What the learning rows learned: predictions against outcomes, error and retrains, node weights, DWA windows.

Each function returns an inline ``<svg>`` (:mod:`app.sim.report.svg`) from one run's
:class:`~app.sim.policies.base.PolicyTrace`; nodes are labelled with their hardware
(``worker-3 · RTX 4090``) through the ``hardware`` map the report is given.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from app.sim.report.svg import new_figure, to_svg

APP_COLOURS = {"upload": "#1f77b4", "gCTF": "#d62728", "Motioncor2": "#2ca02c"}
# none of the apps' colours: a retrain marker stands beside the apps' error lines
REASON_COLOURS = {"initial": "#7f7f7f", "cold_start": "#9467bd", "drift": "#ff7f0e", "growth": "#8c564b",
                  "manual": "#e377c2", "schedule": "#17becf"}
REASON_TEXT = {
    "cold_start": "first model: the key's samples reached the cold-start count",
    "growth": "more history: the key's samples grew by the growth fraction since the last ask",
    "drift": "the prediction error drifted (Page-Hinkley on the per-period errors)",
    "manual": "asked by an operator", "schedule": "a scheduled retrain", "initial": "the initial model",
}
MAX_POINTS = 4000  # per app in a scatter (rasterised): enough to see the shape, small enough to embed


def reason_kind(reason: str) -> str:
    """``drift on worker-1: cumulative 2.10`` -> ``drift``; ``cold_start`` -> ``cold_start``."""
    return reason.split(" ", 1)[0].split(":", 1)[0] or "other"


def node_label(node: str, hardware: Mapping[str, str]) -> str:
    return f"{node} · {hardware[node]}" if node in hardware else node


def predicted_vs_observed(runs: Mapping[str, Any], fig_id: str, seed: int = 0) -> str:
    """Per row, predicted against observed RTT (log-log) coloured by app, with the identity line."""
    cols = min(2, len(runs))
    rows = -(-len(runs) // cols)
    fig, axes = new_figure(13.0 if cols == 2 else 6.8, 6.2 * rows, rows, cols)
    rng = np.random.default_rng(seed)
    for ax in axes[len(runs):]:
        ax.set_visible(False)
    for ax, (name, run) in zip(axes, runs.items(), strict=False):
        pred, rtt, apps = run.predicted_ms, run.rtt_ms, np.array(run.apps)
        ok = np.isfinite(pred) & run.ok & (pred > 0) & (rtt > 0)
        for app in sorted(set(run.apps)):
            idx = np.flatnonzero(ok & (apps == app))
            if idx.size > MAX_POINTS:
                idx = np.sort(rng.choice(idx, MAX_POINTS, replace=False))
            ax.scatter(rtt[idx], pred[idx], s=6, alpha=0.35, color=APP_COLOURS.get(app), label=app, rasterized=True)
        if ok.any():
            lo, hi = float(min(rtt[ok].min(), pred[ok].min())), float(max(rtt[ok].max(), pred[ok].max()))
            ax.plot([lo, hi], [lo, hi], "k--", lw=1.2, label="prediction = observation")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("observed RTT (ms, log)")
        ax.set_ylabel("predicted RTT (ms, log)")
        ax.set_title(f"{name}: {int(ok.sum())} predictions joined")
        ax.legend(markerscale=3, loc="upper left")
    fig.tight_layout()
    return to_svg(fig, fig_id, "predicted against observed RTT, coloured by app")


def error_over_time(run: Any, name: str, fig_id: str) -> str:
    """Per-period MAPE per app (mean over nodes); every retrain marked and coloured by its reason."""
    fig, (ax,) = new_figure(13.0, 5.0)
    by_app: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for t, key, mape in run.trace.errors:
        by_app[key.rsplit(":", 1)[-1]][t].append(mape)
    values = []
    for app, pts in sorted(by_app.items()):
        ts = sorted(pts)
        ys = [float(np.mean(pts[t])) for t in ts]
        values += ys
        ax.plot(ts, ys, lw=1.4, color=APP_COLOURS.get(app), label=f"MAPE {app}")
    top = float(np.nanpercentile(values, 99)) * 1.25 if values else 1.0
    ax.set_ylim(0, max(top, 0.05))
    counts: dict[str, int] = defaultdict(int)
    for t, _key, reason in run.trace.retrains:
        kind = reason_kind(reason)
        counts[kind] += 1
        colour = REASON_COLOURS.get(kind, "#7f7f7f")
        ax.axvline(t, color=colour, lw=1.0, alpha=0.55, zorder=1)
        ax.plot([t], [1.0], marker="v", ms=9, color=colour, transform=ax.get_xaxis_transform(), clip_on=False)
    for kind, n in sorted(counts.items()):
        ax.plot([], [], marker="v", ms=9, color=REASON_COLOURS.get(kind, "#7f7f7f"), ls="-", lw=1.0,
                label=f"retrain: {kind.replace('_', ' ')} ({n})")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("MAPE per 5 s period (clipped at p99)")
    ax.set_title(f"{name}: prediction error over time; ▼ = a retrain, coloured by why", pad=16)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return to_svg(fig, fig_id, f"{name}: prediction error over time with retrains")


def _series(points: Sequence[tuple[float, str, float]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    raw: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for t, key, v in points:
        raw[key][0].append(t)
        raw[key][1].append(v)
    return {k: (np.array(ts), np.array(vs)) for k, (ts, vs) in raw.items()}


def _at(ts: np.ndarray, vs: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The step function (last value so far) of one series on ``grid``; NaN before its first point."""
    order = np.argsort(ts, kind="stable")
    i = np.searchsorted(ts[order], grid, side="right") - 1
    return np.where(i >= 0, vs[order][np.clip(i, 0, None)], np.nan)


def node_weights(run: Any, name: str, hardware: Mapping[str, str], fig_id: str, max_panels: int = 12) -> str:
    """Credibility per node over time: one small panel per node (hardware in the title) up to ``max_panels``
    nodes, else the median and 10-90 % band per hardware model."""
    series = _series(run.trace.weights)
    nodes = sorted(series, key=lambda n: (hardware.get(n, "").startswith("CPU"), hardware.get(n, ""), n))
    if len(nodes) <= max_panels:
        cols = min(4, max(len(nodes), 1))
        rows = -(-len(nodes) // cols) or 1
        fig, axes = new_figure(13.0, 2.9 * rows, rows, cols, sharex=True, sharey=True)
        for ax, node in zip(axes, nodes, strict=False):
            ts, vs = series[node]
            ax.step(ts, vs, where="post", lw=1.6, color="#1f77b4")
            ax.set_title(node_label(node, hardware), fontsize=11)
            ax.set_ylim(-0.03, 1.03)
            ax.set_xlabel("simulated time (s)")
            ax.set_ylabel("credibility")
        for ax in axes[len(nodes):]:
            ax.set_visible(False)
    else:
        fig, (ax,) = new_figure(13.0, 5.0)
        groups: dict[str, list[str]] = defaultdict(list)
        for n in nodes:
            groups[hardware.get(n, "unknown")].append(n)
        _bands(ax, series, groups)
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("credibility (median, 10-90 % band)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.suptitle(f"{name}: node weights (credibility of each node's predictions)", fontsize=12)
    fig.tight_layout()
    return to_svg(fig, fig_id, f"{name}: node weights over time, per node and hardware")


def _bands(ax: Any, series: Mapping[str, tuple[np.ndarray, np.ndarray]], groups: Mapping[str, Sequence[str]],
           colours: Mapping[str, str] | None = None) -> None:
    """Median line and 10-90 % band across each group's series, sampled on a common time grid (a group keeps
    its colour from ``colours``, so that it reads the same in every panel)."""
    t_all = np.concatenate([series[k][0] for ks in groups.values() for k in ks]) if groups else np.empty(0)
    if not t_all.size:
        return
    grid = np.linspace(float(t_all.min()), float(t_all.max()), 200)
    for i, (group, keys) in enumerate(sorted(groups.items())):
        stack = np.vstack([_at(*series[k], grid) for k in keys])
        with warnings.catch_warnings():  # a time before any of the group's points: an all-NaN column, NaN out
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(stack, axis=0)
            lo, hi = np.nanpercentile(stack, [10, 90], axis=0)
        colour = (colours or {}).get(group, f"C{i % 10}")
        ax.plot(grid, med, color=colour, lw=2.0, label=f"{group}: median of {len(keys)}")
        ax.fill_between(grid, lo, hi, color=colour, alpha=0.2, lw=0)


CLASS_COLOURS = {"gpu nodes": "C0", "cpu nodes": "C1"}  # the same in every app's panel


def dwa_windows(run: Any, name: str, fig_id: str) -> str:
    """DWA feature windows: one panel per app, median and 10-90 % band across the nodes of each class."""
    series = _series(run.trace.windows)
    classes = dict(zip(run.node_names, run.node_classes, strict=True))
    apps = sorted({k.rsplit(":", 1)[-1] for k in series})
    fig, axes = new_figure(13.0, 4.2, 1, max(len(apps), 1), sharey=True)
    for ax, app in zip(axes, apps, strict=False):
        groups: dict[str, list[str]] = defaultdict(list)
        for key in series:
            node, key_app = key.rsplit(":", 1)
            if key_app == app:
                groups[f"{classes.get(node, 'unknown')} nodes"].append(key)
        _bands(ax, series, groups, CLASS_COLOURS)
        ax.set_title(app)
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("feature window (s)")
        ax.legend(loc="upper left", fontsize=9)
    fig.suptitle(f"{name}: DWA windows per node class (median and 10-90 % band across nodes)", fontsize=12)
    fig.tight_layout()
    return to_svg(fig, fig_id, f"{name}: DWA window sizes over time per node class")
