"""Figures of the report, each a PNG (bytes) drawn with matplotlib's Agg backend (no display needed)."""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np

from app.sim.results import RunMetrics


def _figure(width: float = 8.0, height: float = 4.2):  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height), dpi=100)
    return plt, fig, ax


def _png(plt, fig) -> bytes:  # type: ignore[no-untyped-def]
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def rtt_distributions(runs: Mapping[str, RunMetrics]) -> bytes:
    """Box plots of RTT per policy (log scale), one seed."""
    plt, fig, ax = _figure()
    names = list(runs)
    data = [runs[n].rtt_ms[runs[n].ok] for n in names]
    ax.boxplot(data, showfliers=False)
    ax.set_xticks(range(1, len(names) + 1), names, rotation=15)
    ax.set_yscale("log")
    ax.set_ylabel("RTT (ms, log scale)")
    ax.set_title("RTT per policy (whiskers 1.5 IQR, outliers hidden)")
    ax.grid(True, axis="y", alpha=0.3)
    return _png(plt, fig)


def predicted_vs_actual(run: RunMetrics) -> bytes:
    """Scatter of predicted vs observed RTT per app (log-log), with the identity line."""
    plt, fig, ax = _figure(6.0, 5.0)
    pred, rtt = run.predicted_ms, run.rtt_ms
    apps = np.array(run.apps)
    ok = np.isfinite(pred) & run.ok
    for app in sorted(set(run.apps)):
        m = ok & (apps == app)
        ax.scatter(rtt[m], pred[m], s=4, alpha=0.4, label=app)
    if ok.any():
        lo, hi = float(np.nanmin(rtt[ok])), float(np.nanmax(rtt[ok]))
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="ideal")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("observed RTT (ms)")
    ax.set_ylabel("predicted RTT (ms)")
    ax.set_title(f"{run.policy}: predicted vs observed")
    ax.legend(markerscale=3)
    ax.grid(True, alpha=0.3)
    return _png(plt, fig)


def _series(points: Sequence[tuple[float, str, float]]) -> dict[str, tuple[list[float], list[float]]]:
    out: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for t, key, v in points:
        out[key][0].append(t)
        out[key][1].append(v)
    return dict(out)


def error_over_time(run: RunMetrics) -> bytes:
    """Per-period MAPE per app (mean over nodes), with a marker line at every retrain."""
    plt, fig, ax = _figure()
    by_app: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for t, key, mape in run.trace.errors:
        by_app[key.rsplit(":", 1)[1]][t].append(mape)
    for app, pts in sorted(by_app.items()):
        ts = sorted(pts)
        ax.plot(ts, [float(np.mean(pts[t])) for t in ts], lw=1.2, label=app)
    for i, (t, _key, _reason) in enumerate(run.trace.retrains):
        ax.axvline(t, color="grey", lw=0.6, ls=":", label="retrain" if i == 0 else None)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("MAPE per 5 s period")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{run.policy}: prediction error over time")
    ax.legend()
    ax.grid(True, alpha=0.3)
    return _png(plt, fig)


def lines_over_time(points: Sequence[tuple[float, str, float]], title: str, ylabel: str,
                    max_lines: int = 12) -> bytes:
    """One line per key (node weights, DWA windows), at most ``max_lines`` (the most frequent keys)."""
    plt, fig, ax = _figure()
    series = _series(points)
    keys = sorted(series, key=lambda k: -len(series[k][0]))[:max_lines]
    for k in sorted(keys):
        ts, vs = series[k]
        ax.step(ts, vs, where="post", lw=1.1, label=k)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if keys:
        ax.legend(fontsize=7, ncol=2)
    ax.grid(True, alpha=0.3)
    return _png(plt, fig)
