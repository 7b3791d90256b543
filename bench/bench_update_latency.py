"""How long a retrain takes to serve, live: the worker's retrain-event to the extender serving the model.

    rttsched demo --out reports/demo && python3 bench/bench_update_latency.py reports/demo [more demo dirs]

Reads the logs a demo run leaves (``logs/worker.log``, ``logs/trainer.log``, ``logs/extender.log``) and pairs
each retrain-event with the trainer's verdict on that key (its fit rows) and, for a promoted model, the
extender's "model … installed" line (loaded into its view) and "model … serving" line (in the snapshot
requests are scored from; logs without it: the installed time stands for it). Prints every update, then the
served ones by band of fit rows
(below ``METRIC_MIN_ROWS``, where the feature vote does not run, and from there), side by side with the
simulator's :class:`~app.sim.policies.training.VerdictDelay` for the same rows, as a ratio: the simulated
trainer's verdict delay is calibrated on these figures (docs/simulator.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import re
import statistics
import sys
from pathlib import Path

from app.sim.policies.training import VerdictDelay
from app.trainer.pipeline import METRIC_MIN_ROWS, fit_rows

EVENT = re.compile(r"retrain-event (\S+) \((\w+)\)")
FIT_ROWS = re.compile(r"challenger \w+: (\d+) fit rows")
VERDICT = re.compile(r"retrain of (\S+) \((\w+)\): (\w+)")
INSTALLED = re.compile(r"model (\S+) v(\d+) installed")
SERVING = re.compile(r"model (\S+) v(\d+) serving")
PROMOTED = ("no_champion", "better")


@dataclasses.dataclass
class Update:
    run: str
    key: str
    reason: str
    fit_rows: int | None
    verdict: str
    to_verdict_s: float
    to_installed_s: float | None
    to_serving_s: float | None = None

    @property
    def served_s(self) -> float | None:
        """Seconds to serving, or to installed where the logs do not say when it served."""
        return self.to_serving_s if self.to_serving_s is not None else self.to_installed_s


def _ts(line: str) -> float | None:
    try:
        return dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


def _lines(path: Path) -> list[tuple[float, str]]:
    if not path.is_file():
        raise SystemExit(f"bench_update_latency: {path} not found (give the --out folder of an `rttsched demo` run)")
    out = []
    for line in path.read_text(errors="replace").splitlines():
        ts = _ts(line)
        if ts is not None:
            out.append((ts, line))
    return out


def updates(run_dir: Path) -> list[Update]:
    """Every retrain-event of one demo run, with its verdict and install times (seconds after the event)."""
    logs = run_dir / "logs"
    events = [(ts, m.group(1), m.group(2)) for ts, line in _lines(logs / "worker.log") if (m := EVENT.search(line))]
    verdicts: list[tuple[float, str, str, int | None]] = []
    rows: int | None = None
    for ts, line in _lines(logs / "trainer.log"):
        if m := FIT_ROWS.search(line):
            rows = int(m.group(1))
        elif m := VERDICT.search(line):
            verdicts.append((ts, m.group(1), m.group(3), rows))
            rows = None
    extender = _lines(logs / "extender.log")
    installs = [(ts, m.group(1), int(m.group(2))) for ts, line in extender if (m := INSTALLED.search(line))]
    serving = {(m.group(1), int(m.group(2))): ts for ts, line in extender if (m := SERVING.search(line))}
    used_v: set[int] = set()
    used_i: set[int] = set()
    out = []
    for ts, key, reason in events:
        v = next((i for i, (tv, k, *_r) in enumerate(verdicts)
                  if i not in used_v and k == key and tv >= ts - 0.01), None)
        if v is None:
            continue  # coalesced by the trainer, or the run ended first
        used_v.add(v)
        tv, _, verdict, fit_rows = verdicts[v]
        installed = served = None
        if verdict in PROMOTED:
            j = next((i for i, (ti, k, _v) in enumerate(installs)
                      if i not in used_i and k == key and ti >= tv - 0.01), None)
            if j is not None:
                used_i.add(j)
                ti, _, version = installs[j]
                installed = ti - ts
                if (key, version) in serving:
                    served = serving[key, version] - ts
        out.append(Update(run_dir.name, key, reason, fit_rows, verdict, tv - ts, installed, served))
    return out


def _rows_for(fit: int) -> int:
    """The snapshot size whose plain split leaves ``fit`` rows to fit (VerdictDelay takes the rows)."""
    n = fit
    while fit_rows(n) < fit:
        n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="the --out folders of `rttsched demo` runs")
    args = ap.parse_args(argv)
    delay = VerdictDelay()
    rows = [u for run in args.runs for u in updates(run)]
    if not rows:
        print("no retrain-events with a verdict in these logs", file=sys.stderr)
        return 1
    print("== every update: seconds after the worker's retrain-event ==")
    print(f"{'run':<14} {'key':<16} {'reason':<11} {'fit rows':>8} {'verdict':<12} {'verdict s':>9} "
          f"{'installed s':>11} {'serving s':>9}")
    for u in rows:
        inst = f"{u.to_installed_s:.2f}" if u.to_installed_s is not None else "-"
        serv = f"{u.to_serving_s:.2f}" if u.to_serving_s is not None else "-"
        fit = str(u.fit_rows) if u.fit_rows is not None else "?"
        print(f"{u.run[:14]:<14} {u.key:<16} {u.reason:<11} {fit:>8} {u.verdict:<12} {u.to_verdict_s:9.2f} {inst:>11}"
              f" {serv:>9}")
    print()
    print("== models serving, by fit rows, against the simulator's VerdictDelay for the same rows ==")
    print(f"{'fit rows':<14} {'n':>3} {'min s':>6} {'median s':>8} {'max s':>6} {'simulated s':>11} "
          f"{'median/simulated':>16}")
    for name, vote in ((f"< {METRIC_MIN_ROWS}", False), (f">= {METRIC_MIN_ROWS}", True)):
        got = [u for u in rows if u.served_s is not None and u.fit_rows is not None
               and (u.fit_rows >= METRIC_MIN_ROWS) == vote]
        if not got:
            print(f"{name:<14} {0:>3}")
            continue
        times = [u.served_s for u in got if u.served_s is not None]
        simulated = statistics.median(delay(_rows_for(u.fit_rows)) for u in got if u.fit_rows is not None)
        med = statistics.median(times)
        print(f"{name:<14} {len(got):>3} {min(times):6.2f} {med:8.2f} {max(times):6.2f} {simulated:11.2f} "
              f"{med / simulated:16.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
