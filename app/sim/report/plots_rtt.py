"""Where and when the RTT gap is: the CDF with its tail, and rolling mean and p95 over simulated time.

Each function returns an inline ``<svg>`` (:mod:`app.sim.report.svg`). Colours stay with a policy across the
report: the scored rows (live first) in strong colours, kube_default in black, the clairvoyant dashed grey,
the other baselines in muted colours.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from app.sim.report.halves import seed_means
from app.sim.report.svg import new_figure, to_svg

# the other baselines: no red or blue, the scored rows' colours
MUTED = ("#8c6d31", "#7b4173", "#e377c2", "#31a354", "#e6550d", "#636363", "#bcbd22", "#17becf")
PERCENTILES = ((50, "o", "p50"), (95, "s", "p95"), (99, "^", "p99"))


def policy_styles(names: Sequence[str], highlight: Collection[str]) -> dict[str, dict[str, Any]]:
    """Line style per policy: ``highlight`` rows strong, kube_default black, clairvoyant dashed grey."""
    strong = iter(("#d62728", "#1f77b4", "#9467bd"))
    muted = iter(MUTED * 4)
    out: dict[str, dict[str, Any]] = {}
    for n in sorted(names, key=lambda n: n not in highlight):
        if n in highlight:
            out[n] = {"color": next(strong), "lw": 2.4, "zorder": 5}
        elif n == "kube_default":
            out[n] = {"color": "black", "lw": 2.0, "zorder": 4}
        elif n == "clairvoyant":
            out[n] = {"color": "#999999", "lw": 1.6, "ls": "--", "zorder": 3}
        else:
            out[n] = {"color": next(muted), "lw": 1.1, "alpha": 0.8, "zorder": 2}
    return out


def _pooled(runs: Sequence[Any]) -> np.ndarray:
    return np.sort(np.concatenate([r.rtt_ms[r.ok] for r in runs]) if runs else np.empty(0))


def quantile_grid(n: int) -> np.ndarray:
    """Probabilities to draw a CDF of ``n`` samples with: even up to 0.9, then log-spaced into the tail."""
    body = np.linspace(0.0, 0.9, 200)
    tail = 1.0 - np.logspace(-1, np.log10(max(1.0 / max(n, 1), 1e-6)), 250)
    return np.unique(np.clip(np.concatenate([body, tail]), 0.0, 1.0))


def rtt_cdf(runs: Mapping[str, Sequence[Any]], highlight: Collection[str], fig_id: str) -> str:
    """CDF of RTT (log x) and its tail (1 - CDF, log-log) per policy, all seeds pooled; p50/p95/p99 marked at
    the mean of each seed's percentile, the figures of the percentile table and the verdict (with one seed, on
    the curve; with several, beside it where the seeds differ)."""
    fig, (body, tail) = new_figure(13.0, 5.2, 1, 2)
    styles = policy_styles(list(runs), highlight)
    for name, style in styles.items():
        rtt = _pooled(runs[name])
        if not rtt.size:
            continue
        q = quantile_grid(rtt.size)
        x = np.quantile(rtt, q)
        body.plot(x, q, label=name, **style)
        tail.plot(x[q < 1.0], 1.0 - q[q < 1.0], **style)
        marks = seed_means(runs[name], "all")
        for pct, marker, _ in PERCENTILES:
            v = marks[f"p{pct}_rtt_ms"]
            body.plot([v], [pct / 100.0], marker=marker, ms=7, color=style["color"], ls="none", zorder=6)
            tail.plot([v], [1.0 - pct / 100.0], marker=marker, ms=7, color=style["color"], ls="none", zorder=6)
    for pct, marker, text in PERCENTILES:
        body.plot([], [], marker=marker, color="#444444", ls="none", label=f"{text} marked")
        tail.axhline(1.0 - pct / 100.0, color="#bbbbbb", lw=0.8, zorder=1)
        tail.annotate(text, (1.0, 1.0 - pct / 100.0), xycoords=("axes fraction", "data"), xytext=(4, 0),
                      textcoords="offset points", va="center", fontsize=10)
    body.set_xscale("log")
    body.set_xlabel("RTT (ms, log scale)")
    body.set_ylabel("fraction of tasks with RTT ≤ x")
    body.set_title("RTT distribution (CDF)")
    tail.set_xscale("log")
    tail.set_yscale("log")
    tail.set_xlabel("RTT (ms, log scale)")
    tail.set_ylabel("fraction of tasks with RTT > x (log)")
    tail.set_title("the tail: 1 − CDF")
    fig.legend(loc="lower center", ncol=6, bbox_to_anchor=(0.5, -0.02), frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return to_svg(fig, fig_id, "RTT distribution per policy with p50, p95 and p99 marked")


def rolling(run: Any, window_s: float, step_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(window ends, mean RTT, p95 RTT) of the tasks that arrived in each sliding window (NaN: < 5 tasks)."""
    ok = run.ok
    t, rtt = run.submit_s[ok], run.rtt_ms[ok]
    order = np.argsort(t, kind="stable")
    t, rtt = t[order], rtt[order]
    if not t.size:
        return np.empty(0), np.empty(0), np.empty(0)
    ends = np.arange(t[0] + window_s, t[-1] + step_s, step_s)
    lo = np.searchsorted(t, ends - window_s, side="right")
    hi = np.searchsorted(t, ends, side="right")
    mean, p95 = np.full(ends.size, np.nan), np.full(ends.size, np.nan)
    for i, (a, b) in enumerate(zip(lo.tolist(), hi.tolist(), strict=True)):
        if b - a >= 5:
            mean[i] = rtt[a:b].mean()
            p95[i] = np.percentile(rtt[a:b], 95)
    return ends, mean, p95


def over_time(runs: Mapping[str, Any], highlight: Sequence[str], warmup_s: float, half_s: float,
              fig_id: str) -> str:
    """Rolling mean and p95 RTT per policy over simulated time, and the highlighted rows' change vs kube_default."""
    compare = [n for n in highlight if n in runs] if "kube_default" in runs else []
    fig, axes = new_figure(13.0, 11.0 if compare else 7.5, 3 if compare else 2, 1, sharex=True)
    m_ax, p_ax, c_ax = (*axes, None)[:3]
    styles = policy_styles(list(runs), highlight)
    span = max(float(np.nanmax(r.submit_s)) for r in runs.values())
    window = max(span / 15.0, 1.0)
    curves = {n: rolling(runs[n], window, window / 4.0) for n in styles}
    for name, style in styles.items():
        ends, mean, p95 = curves[name]
        m_ax.plot(ends, mean, label=name, **style)
        p_ax.plot(ends, p95, **style)
    for ax in axes:
        ax.axvspan(0.0, warmup_s, color="#f2e6c9", alpha=0.6, zorder=0)
        ax.axvline(half_s, color="#555555", lw=1.0, ls="--", zorder=1)
    m_ax.annotate("warm-up (first 20 % of tasks)", (warmup_s / 2, 1.0), xycoords=("data", "axes fraction"),
                  xytext=(0, -14), textcoords="offset points", ha="center", fontsize=10)
    m_ax.annotate("second half of the tasks →", (half_s, 1.0), xycoords=("data", "axes fraction"), xytext=(6, -14),
                  textcoords="offset points", fontsize=10)
    m_ax.set_ylabel("mean RTT (ms)")
    m_ax.set_title(f"rolling mean RTT (tasks that arrived in the last {window:.0f} s)")
    p_ax.set_ylabel("p95 RTT (ms)")
    p_ax.set_title("rolling p95 RTT")
    for ax in (m_ax, p_ax):
        ax.set_ylim(bottom=0)
    m_ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    if c_ax is not None:
        _change_panel(c_ax, curves, compare, styles)
    axes[-1].set_xlabel("simulated time (s) at the window's end")
    fig.tight_layout()
    return to_svg(fig, fig_id, "rolling mean and p95 RTT over time, and the change against kube_default")


def _change_panel(ax: Any, curves: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]], rows: Sequence[str],
                  styles: Mapping[str, Mapping[str, Any]]) -> None:
    """The rows' rolling mean and p95 against kube_default's over the same windows, in per cent."""
    base = curves["kube_default"]
    for name in rows:
        ends, mean, p95 = curves[name]
        if ends.size != base[0].size:  # another workload (not the same seed): no window-by-window comparison
            continue
        with np.errstate(invalid="ignore", divide="ignore"):
            ax.plot(ends, 100.0 * (mean / base[1] - 1.0), label=f"{name}: mean", **styles[name])
            ax.plot(ends, 100.0 * (p95 / base[2] - 1.0), label=f"{name}: p95", **{**styles[name], "ls": ":"})
    ax.axhline(0.0, color="black", lw=1.0)
    ax.set_ylabel("change vs kube_default (%)")
    ax.set_title("change against kube_default over the same windows (below 0: faster)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
