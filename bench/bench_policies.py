"""Policy comparison over seeds, offline throughput, and DWA against a fixed 30 s window.

    python3 bench/bench_policies.py            # small preset, 5 seeds x 5000 tasks
    python3 bench/bench_policies.py --quick    # a few seconds: 2 seeds x 1500 tasks, small models

Prints (1) mean ± 95 % CI per policy of the seed's figures, (2) the goals as measured ratios,
(3) simulated tasks per second of wall time per policy against the 10,000 tasks/s goal,
(4) prediction RMSE of gCTF and Motioncor2 on GPU nodes with DWA and with a fixed 30 s window
(bench/bench_learning.py compares the learning path's options).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from tqdm import tqdm

from app.sim.policies import POLICY_NAMES
from app.sim.policies.rtt_aware import RttAware
from app.sim.report import format_goals, format_table, goal_rows, summarise
from app.sim.runner import SimConfig, run_offline

THROUGHPUT_GOAL = 10_000.0


def rmse_on_gpu(m, app: str) -> float:
    apps = np.array(m.apps)
    ok = np.isfinite(m.predicted_ms) & m.ok & (apps == app) & (m.task_node_class() == "gpu")
    ok &= np.arange(len(apps)) >= len(apps) // 5
    if not ok.any():
        return float("nan")
    return float(np.sqrt(np.mean((m.predicted_ms[ok] - m.rtt_ms[ok]) ** 2)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--tasks", type=int, default=None)
    ap.add_argument("--preset", default="small")
    args = ap.parse_args()
    seeds = list(range(1, 1 + (args.seeds or (2 if args.quick else 5))))
    n_tasks = args.tasks or (1500 if args.quick else 5000)
    params = {"n_estimators": 30, "learning_rate": 0.25} if args.quick else None
    cfg = SimConfig(preset=args.preset, n_tasks=n_tasks)

    def factory(dwa: bool):
        return lambda rng: RttAware(rng, dwa=dwa, select=not args.quick, train_params=params)

    runs: dict[str, list] = {p: [] for p in POLICY_NAMES}
    fixed: list = []
    with tqdm(total=len(seeds) * (len(POLICY_NAMES) + 1), file=sys.stderr, unit="run") as bar:
        for seed in seeds:
            for p in POLICY_NAMES:
                bar.set_postfix_str(f"{p} seed {seed}")
                runs[p].append(run_offline(cfg, factory(True) if p == "rtt_aware" else p, seed))
                bar.update(1)
            bar.set_postfix_str(f"rtt_aware fixed 30 s seed {seed}")
            fixed.append(run_offline(cfg, factory(False), seed))
            bar.update(1)

    agg = summarise(runs)
    print(f"\n== policies: preset {args.preset}, {n_tasks} tasks, seeds {seeds[0]}..{seeds[-1]} ==")
    print(format_table(agg))
    print("\n== goals (relative change on seed means) ==")
    print(format_goals(goal_rows(agg)))
    acc = sorted({k for v in agg.values() for k in v if k.startswith("acc:")})
    if acc:
        print("\n== prediction accuracy 1 - MAPE after warm-up ==")
        print(format_table({p: agg[p] for p in ("rtt_aware", "oracle")}, acc))

    print("\n== offline throughput (simulated tasks per second of wall time) ==")
    print(f"{'policy':<14}{'tasks/s':>12}{'vs goal 10k':>13}")
    for p in POLICY_NAMES:
        rate = float(np.mean([r.summary()["tasks_per_wall_s"] for r in runs[p]]))
        print(f"{p:<14}{rate:>12.0f}{rate / THROUGHPUT_GOAL:>12.2f}x")

    print("\n== DWA vs fixed 30 s window: prediction RMSE on GPU nodes (ms, mean over seeds) ==")
    print(f"{'app':<12}{'DWA':>10}{'fixed 30 s':>12}{'change':>9}")
    for app in ("gCTF", "Motioncor2"):
        d = float(np.nanmean([rmse_on_gpu(m, app) for m in runs["rtt_aware"]]))
        f = float(np.nanmean([rmse_on_gpu(m, app) for m in fixed]))
        print(f"{app:<12}{d:>10.1f}{f:>12.1f}{d / f - 1:>+9.1%}")
    t0 = time.perf_counter()
    run_offline(SimConfig(preset=args.preset, n_tasks=20000), "round_robin", 99)
    dt = time.perf_counter() - t0
    print(f"\nround_robin, 20000 tasks: {dt:.2f} s wall = {20000 / dt:.0f} tasks/s "
          f"({20000 / dt / THROUGHPUT_GOAL:.2f}x the goal)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
