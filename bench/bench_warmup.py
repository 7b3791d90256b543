"""Where rtt_aware's mean RTT goes over the clairvoyant's, by app and by when the task arrived.

    python3 bench/bench_warmup.py                                  # large scenario, seed 1
    python3 bench/bench_warmup.py --scenario default --seed 2 --edges 0,10,30,60,120
    python3 bench/bench_warmup.py --quick                          # a quarter of the run

Runs the scenario with the clairvoyant reference, the calibrated table (``static_best``) and rtt_aware on
one seed and splits the tasks by their submission time (``--edges``, simulated seconds). Per slice and app
it prints the three policies' mean RTT, the share of the app's tasks each ran on CPU nodes, and what the
slice adds to rtt_aware's mean over the whole run beyond the clairvoyant's (``gap ms``: the slice's RTT sum
minus the clairvoyant's for the same tasks, over all tasks of the run; the column sums to the difference of
the two means, up to tasks only one of them could not run). The slices of the warm-up (before the first
models, then models trained on a few dozen rows) against the rest say how much of a whole-run figure is
learning and how much is placement.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from bench_policies import shorten
from tqdm import tqdm

from app.sim.policies.rtt_aware import RttAware
from app.sim.results import RunMetrics
from app.sim.runner import run_offline
from app.sim.scenario import load_scenario
from app.sim.scenario_paths import scenario_path

POLICIES = ("clairvoyant", "static_best", "rtt_aware")
SHORT = {"clairvoyant": "clairv.", "static_best": "table", "rtt_aware": "rtt_aware"}


def _edges(text: str) -> list[float]:
    try:
        edges = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated seconds (got {text!r})") from None
    if len(edges) < 2 or any(b <= a for a, b in zip(edges, edges[1:])) or edges[0] < 0:
        raise argparse.ArgumentTypeError(f"at least two increasing seconds from 0 on (got {text!r})")
    return edges


def rows(runs: dict[str, RunMetrics], edges: list[float]) -> list[list[str]]:
    """One row per slice and app: means, CPU shares and the slice's part of the gap (see the module doc)."""
    r, c = runs["rtt_aware"], runs["clairvoyant"]
    n = int(r.ok.sum())
    cls = {p: m.task_node_class() for p, m in runs.items()}
    apps = np.asarray(r.apps)
    out = []
    for lo, hi in zip(edges, [*edges[1:], np.inf], strict=True):
        for app in sorted(set(r.apps)):
            cells = [f"{lo:g}–{hi:g} s" if np.isfinite(hi) else f"{lo:g} s –", app]
            sel = {p: m.ok & (m.submit_s >= lo) & (m.submit_s < hi) & (apps == app) for p, m in runs.items()}
            if not sel["rtt_aware"].any():
                continue
            cells.append(str(int(sel["rtt_aware"].sum())))
            cells += [f"{runs[p].rtt_ms[sel[p]].mean():.1f}" if sel[p].any() else "–" for p in POLICIES]
            cells += [f"{(cls[p][sel[p]] == 'cpu').mean():.2f}" if sel[p].any() else "–" for p in POLICIES]
            gap = (r.rtt_ms[sel["rtt_aware"]].sum() - c.rtt_ms[sel["clairvoyant"]].sum()) / n
            cells.append(f"{gap:+.2f}")
            out.append(cells)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="large", help="a name in scenarios/ or a path (default: large)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--edges", type=_edges, default=_edges("0,1,2,4,6"),
                    help="slice starts in simulated seconds; the last slice runs to the end (default: 0,1,2,4,6)")
    ap.add_argument("--quick", action="store_true", help="a quarter of the run")
    args = ap.parse_args()
    try:
        path = scenario_path(args.scenario)
    except ValueError as exc:
        ap.error(f"--scenario: {exc}")
    sc = load_scenario(path)
    config = shorten(sc.config) if args.quick else sc.config
    runs: dict[str, RunMetrics] = {}
    for p in tqdm(POLICIES, file=sys.stderr, unit="run", desc=f"{args.scenario} seed {args.seed}"):
        runs[p] = run_offline(config, (lambda rng: RttAware(rng)) if p == "rtt_aware" else p, args.seed)
    means = {p: float(m.rtt_ms[m.ok].mean()) for p, m in runs.items()}
    print(f"== {args.scenario}, seed {args.seed}: mean RTT " + ", ".join(f"{p} {v:.2f} ms" for p, v in means.items())
          + f"; rtt_aware over the clairvoyant {means['rtt_aware'] - means['clairvoyant']:+.2f} ms ==")
    head = ["arrived", "app", "tasks", *(f"{SHORT[p]} ms" for p in POLICIES), *(f"{SHORT[p]} CPU" for p in POLICIES),
            "gap ms"]
    body = rows(runs, args.edges)
    width = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, width, strict=True)))
    for b in body:
        print("  ".join(x.rjust(w) for x, w in zip(b, width, strict=True)))
    print(f"(ms: mean RTT; CPU: share on CPU nodes; table: static_best; gap ms: the slice's part of rtt_aware's "
          f"mean over the clairvoyant's, sum {sum(float(b[-1]) for b in body):+.2f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
