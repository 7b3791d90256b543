"""Task arrivals: Poisson, bursty (two-state Markov-modulated Poisson) or replayed from a trace file.

A workload is drawn once, up front, as arrays; every policy then runs the very same tasks with the very
same noise draws (common random numbers), so policy differences are not sampling luck.

>>> import numpy as np
>>> w = poisson_workload(np.random.default_rng(1), n_tasks=1000, rate_per_s=50.0)
>>> len(w), bool(np.all(np.diff(w.arrival_s) >= 0)), sorted(set(w.apps))
(1000, True, ['Motioncor2', 'gCTF', 'upload'])
>>> bool(15.0 < w.arrival_s[-1] < 25.0)
True
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import orjson

from app.errors import RttError, read_error

DEFAULT_MIX: dict[str, float] = {"upload": 0.45, "gCTF": 0.35, "Motioncor2": 0.20}
# log-normal input sizes (median MB, sigma), clipped to [lo, hi]
INPUT_MB: dict[str, tuple[float, float, float, float]] = {
    "upload": (40.0, 0.5, 5.0, 200.0),
    "gCTF": (80.0, 0.4, 10.0, 300.0),
    "Motioncor2": (150.0, 0.5, 30.0, 600.0),
}


class TraceError(RttError):
    """A trace file cannot be read or a row is invalid."""


@dataclasses.dataclass(frozen=True)
class Workload:
    """``n`` tasks: arrival time (s from start), app, input size (MB) and a standard-normal noise draw."""

    arrival_s: np.ndarray
    apps: tuple[str, ...]
    input_mb: np.ndarray
    noise_z: np.ndarray

    def __len__(self) -> int:
        return len(self.apps)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self) else 0.0


def _sizes(rng: np.random.Generator, apps: list[str]) -> np.ndarray:
    out = np.empty(len(apps))
    z = rng.standard_normal(len(apps))
    for i, a in enumerate(apps):
        med, sigma, lo, hi = INPUT_MB[a]
        out[i] = min(hi, max(lo, med * float(np.exp(sigma * z[i]))))
    return out


def check_mix(mix: Mapping[str, float]) -> None:
    """Raise ``ValueError`` naming ``workload.mix`` unless it maps known apps to weights >= 0, not all 0."""
    unknown = sorted(set(mix) - set(INPUT_MB))
    if unknown:
        raise ValueError(f"workload.mix: unknown app {unknown[0]!r} (known: {', '.join(sorted(INPUT_MB))})")
    if any(not (v >= 0) for v in mix.values()) or sum(mix.values()) <= 0:
        raise ValueError(f"workload.mix: weights must be >= 0 and not all 0 (got {dict(mix)})")


def draw_tasks(rng: np.random.Generator, n: int, mix: Mapping[str, float]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``n`` tasks' apps (drawn from ``mix``), input sizes (MB) and standard-normal noise draws."""
    check_mix(mix)
    names = sorted(mix)
    p = np.array([mix[n] for n in names], dtype=float)
    idx = rng.choice(len(names), size=n, p=p / p.sum())
    apps = [names[i] for i in idx]
    return apps, _sizes(rng, apps), rng.standard_normal(n)


def _build(rng: np.random.Generator, arrival: np.ndarray, mix: Mapping[str, float]) -> Workload:
    apps, sizes, z = draw_tasks(rng, len(arrival), mix)
    return Workload(arrival, tuple(apps), sizes, z)


def poisson_workload(rng: np.random.Generator, n_tasks: int, rate_per_s: float,
                     mix: Mapping[str, float] | None = None) -> Workload:
    """``n_tasks`` Poisson arrivals at ``rate_per_s``."""
    if n_tasks <= 0 or rate_per_s <= 0:
        raise ValueError(f"workload: n_tasks and rate_per_s must be > 0 (got {n_tasks}, {rate_per_s})")
    arrival = np.cumsum(rng.exponential(1.0 / rate_per_s, size=n_tasks))
    return _build(rng, arrival, mix or DEFAULT_MIX)


def bursty_workload(rng: np.random.Generator, n_tasks: int, rate_per_s: float,
                    mix: Mapping[str, float] | None = None, burst_factor: float = 4.0,
                    burst_fraction: float = 0.2, mean_burst_s: float = 5.0) -> Workload:
    """Markov-modulated Poisson: bursts at ``burst_factor`` x the quiet rate, ``burst_fraction`` of the time.

    The long-run rate is ``rate_per_s``.
    """
    if not (0 < burst_fraction < 1) or burst_factor < 1 or mean_burst_s <= 0:
        raise ValueError("bursty_workload: need 0 < burst_fraction < 1, burst_factor >= 1, mean_burst_s > 0")
    if n_tasks <= 0 or rate_per_s <= 0:
        raise ValueError(f"workload: n_tasks and rate_per_s must be > 0 (got {n_tasks}, {rate_per_s})")
    quiet = rate_per_s / (1 - burst_fraction + burst_fraction * burst_factor)
    mean_quiet_s = mean_burst_s * (1 - burst_fraction) / burst_fraction
    out = np.empty(n_tasks)
    t, i, burst = 0.0, 0, False
    while i < n_tasks:
        period_end = t + rng.exponential(mean_burst_s if burst else mean_quiet_s)
        rate = quiet * (burst_factor if burst else 1.0)
        while i < n_tasks:
            t += rng.exponential(1.0 / rate)
            if t > period_end:
                t = period_end
                break
            out[i] = t
            i += 1
        burst = not burst
    return _build(rng, out, mix or DEFAULT_MIX)


def trace_workload(path: str | Path, rng: np.random.Generator, limit: int | None = None) -> Workload:
    """Replay a trace: CSV with a header, or JSON lines; fields ``ts`` (s), ``app``, ``input_size_mb``.

    Times are shifted so the first task arrives at 0; rows are sorted by time.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{p}: {read_error(exc)}") from None
    rows: list[dict[str, object]] = []
    if p.suffix in (".jsonl", ".json", ".ndjson"):
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(orjson.loads(line))
                except orjson.JSONDecodeError as exc:
                    raise TraceError(f"{p}:{n}: {exc}") from None
    else:
        rows = list(csv.DictReader(text.splitlines()))
    parsed: list[tuple[float, str, float]] = []
    for n, r in enumerate(rows[:limit] if limit else rows, 1):
        try:
            ts, app, size = float(r["ts"]), str(r["app"]), float(r["input_size_mb"])  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError) as exc:
            raise TraceError(f"{p}: row {n}: needs ts, app, input_size_mb ({exc})") from None
        if app not in INPUT_MB:
            raise TraceError(f"{p}: row {n}: unknown app {app!r} (known: {', '.join(sorted(INPUT_MB))})")
        if not (0 < size < math.inf):
            raise TraceError(f"{p}: row {n}: input_size_mb must be a number > 0 (got {size:g})")
        if not math.isfinite(ts):
            raise TraceError(f"{p}: row {n}: ts must be a finite number of seconds (got {ts:g})")
        parsed.append((ts, app, size))
    if not parsed:
        raise TraceError(f"{p}: no tasks")
    parsed.sort(key=lambda x: x[0])
    t0 = parsed[0][0]
    arrival = np.array([x[0] - t0 for x in parsed])
    return Workload(arrival, tuple(x[1] for x in parsed), np.array([x[2] for x in parsed]),
                    rng.standard_normal(len(parsed)))


def write_trace(workload: Workload, path: str | Path) -> None:
    """Write a workload as a CSV trace (``ts,app,input_size_mb``) that :func:`trace_workload` reads."""
    with Path(path).open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["ts", "app", "input_size_mb"])
        for t, a, s in zip(workload.arrival_s, workload.apps, workload.input_mb, strict=True):
            w.writerow([f"{t:.6f}", a, f"{s:.3f}"])
