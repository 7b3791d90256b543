"""Drift detectors (Page-Hinkley, CUSUM) against naive single-window alarms on seeded per-window MAPE streams.

Each seed draws, from one ``random.Random(seed)`` in this order, a stationary stream of 500 windows and
two change streams of 200 windows; each window's MAPE is ``max(0, N(mean, sigma))`` with mean 0.10 until
window 100, then

* ``MAPE x2``: 0.20 (a model getting twice as wrong: a slow or partial change);
* ``RTT x2``: 0.50 — what a node whose RTT doubles does to a model that still predicts the old RTT
  (``|p - 2p| / 2p = 0.5`` per task).

Every detector sees the same values, with a fresh instance per stream, and restarts after each alarm
(the detectors do so by themselves). ``page_hinkley`` is the default detector (Page-Hinkley with its
level-shift rule); ``ph, no jump`` is Page-Hinkley alone.

* false alarms: alarms on the stationary stream, averaged per 500 windows;
* delay: ``index of the first alarm - 100`` (0 = the first changed window), over the change streams whose
  first alarm came at or after the change; ``early`` counts the streams that alarmed before it (those are
  false alarms, left out of the delays); ``missed`` counts the streams with no alarm in windows 100..199.

Baselines (alarm on one window, no accumulation):

* ``k x mean``: alarm when a window exceeds ``k`` times the mean of the windows before it since the last
  alarm, after the same 12-window warm-up as Page-Hinkley; the ratio columns compare against this one;
* ``fixed``: alarm when a window exceeds a fixed MAPE.

Ratios, at the same sigma and change: ``FA ratio`` divides the false alarms, ``detect ratio`` the median
number of changed windows seen up to and including the alarm (``median delay + 1``, so a baseline that
alarms on the first changed window still gives a finite ratio).

    python3 bench/bench_drift.py            # 200 streams per sigma
    python3 bench/bench_drift.py --quick    # 40 streams per sigma, about a second
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.drift.base import DriftDetector  # noqa: E402
from app.drift.cusum import Cusum  # noqa: E402
from app.drift.pagehinkley import PageHinkley  # noqa: E402

MEAN = 0.10
CHANGE_AT = 100  # windows of 5 s
CHANGES = {"MAPE x2": 0.20, "RTT x2": 0.50}  # mean MAPE after the change
CHANGE_LEN = 200
STATIONARY_LEN = 500
WARM_UP = 12


class RatioAlarm:
    """Alarm when one window exceeds ``k`` times the running mean of the windows before it."""

    def __init__(self, k: float = 2.0, min_instances: int = WARM_UP) -> None:
        self.k, self.min_instances = k, min_instances
        self._n, self._sum, self._drift = 0, 0.0, False

    @property
    def drift_detected(self) -> bool:
        return self._drift

    def update(self, x: float, ts: float | None = None) -> Self:
        if self._drift:
            self._n, self._sum = 0, 0.0
        self._drift = self._n >= self.min_instances and x > self.k * self._sum / self._n
        self._n += 1
        self._sum += x
        return self


class FixedAlarm:
    """Alarm when one window exceeds ``threshold``."""

    def __init__(self, threshold: float = 0.2) -> None:
        self.threshold = threshold
        self._drift = False

    @property
    def drift_detected(self) -> bool:
        return self._drift

    def update(self, x: float, ts: float | None = None) -> Self:
        self._drift = x > self.threshold
        return self


Factory = Callable[[], DriftDetector | RatioAlarm | FixedAlarm]


@dataclasses.dataclass
class Row:
    detector: str
    sigma: float
    change: str
    false_alarms: float  # per 500 stationary windows
    delays: list[int]
    early: int
    missed: int

    @property
    def median_delay(self) -> float:
        return float(statistics.median(self.delays)) if self.delays else float("nan")

    @property
    def max_delay(self) -> int:
        return max(self.delays, default=-1)


def _stream(rng: random.Random, n: int, mean: float, sigma: float) -> list[float]:
    return [max(0.0, rng.gauss(mean, sigma)) for _ in range(n)]


def _alarms(make: Factory, values: Sequence[float]) -> list[int]:
    d = make()
    return [i for i, x in enumerate(values) if d.update(x, ts=5.0 * i).drift_detected]


def measure(detectors: dict[str, Factory], sigma: float, n_streams: int) -> list[Row]:
    """One row per change and detector over ``n_streams`` seeded streams with per-window noise ``sigma``."""
    rows = {(c, name): Row(name, sigma, c, 0.0, [], 0, 0) for c in CHANGES for name in detectors}
    for seed in range(n_streams):
        rng = random.Random(seed)
        stationary = _stream(rng, STATIONARY_LEN, MEAN, sigma)
        changes = {c: _stream(rng, CHANGE_AT, MEAN, sigma) + _stream(rng, CHANGE_LEN - CHANGE_AT, after, sigma)
                   for c, after in CHANGES.items()}
        for name, make in detectors.items():
            false_alarms = len(_alarms(make, stationary)) * 500 / STATIONARY_LEN / n_streams
            for c, values in changes.items():
                row = rows[(c, name)]
                row.false_alarms += false_alarms
                hits = _alarms(make, values)
                if not any(i >= CHANGE_AT for i in hits):
                    row.missed += 1
                if hits and hits[0] < CHANGE_AT:
                    row.early += 1
                elif hits:
                    row.delays.append(hits[0] - CHANGE_AT)
        if (seed + 1) % max(1, n_streams // 4) == 0:
            print(f"  sigma={sigma}: {seed + 1}/{n_streams} streams", file=sys.stderr, flush=True)
    return list(rows.values())


def _ratio(a: float, b: float) -> str:
    if b == 0.0:
        return "n/a" if a else "1"
    return f"{a / b:.3g}"


def render(rows: Sequence[Row], baseline: str, n_streams: int) -> str:
    """The table: one line per change, sigma and detector; ratios against ``baseline`` at the same both."""
    base = {(r.sigma, r.change): r for r in rows if r.detector == baseline}
    head = (f"{'change':<8} {'detector':<16} {'sigma':>5} {'FA/500':>7} {'median':>6} {'max':>4} {'early':>5} "
            f"{'missed':>6} {'FA ratio':>8} {'detect ratio':>12}")
    lines = [f"{n_streams} streams per sigma, MAPE {MEAN:.2f} changing at window {CHANGE_AT}; "
             f"delays in windows; ratios vs {baseline!r}", head, "-" * len(head)]
    for r in rows:
        b = base[(r.sigma, r.change)]
        lines.append(f"{r.change:<8} {r.detector:<16} {r.sigma:>5.2f} {r.false_alarms:>7.3f} {r.median_delay:>6.1f} "
                     f"{r.max_delay:>4d} {r.early:>5d} {r.missed:>6d} {_ratio(r.false_alarms, b.false_alarms):>8} "
                     f"{_ratio(r.median_delay + 1, b.median_delay + 1):>12}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="40 streams per sigma instead of 200")
    p.add_argument("--streams", type=int, default=None, help="streams per sigma")
    p.add_argument("--k", type=float, default=2.0, help="baseline: alarm above k x running mean (default 2)")
    p.add_argument("--fixed", type=float, default=0.2, help="baseline: alarm above this MAPE (default 0.2)")
    args = p.parse_args(argv)
    n_streams = args.streams or (40 if args.quick else 200)
    baseline = f"{args.k:g} x mean"
    detectors: dict[str, Factory] = {
        "page_hinkley": PageHinkley,
        "ph, no jump": lambda: PageHinkley(jump=None),
        "cusum": Cusum,
        baseline: lambda: RatioAlarm(args.k),
        f"fixed {args.fixed:g}": lambda: FixedAlarm(args.fixed),
    }
    rows: list[Row] = []
    for sigma in (0.03, 0.05):
        rows += measure(detectors, sigma, n_streams)
    rows.sort(key=lambda r: (list(CHANGES).index(r.change), r.sigma))  # stable: detector order kept
    print(render(rows, baseline, n_streams))
    return 0


if __name__ == "__main__":
    sys.exit(main())
