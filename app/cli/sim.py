"""``rttsched sim``: run the policies side by side on the simulated cluster, offline, and write the report."""

from __future__ import annotations

import argparse
from typing import Any

HELP = "compare placement policies on the simulated heterogeneous cluster (offline) and write CSV/JSON/HTML"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", choices=["small", "large"], default="small", help="cluster preset")
    p.add_argument("--nodes", type=int, default=None, help="node count of the large preset (default 300)")
    p.add_argument("--policies", default="all", help="'all' or a comma-separated list of policy names")
    p.add_argument("--seeds", type=int, default=5, help="number of seeds (runs per policy)")
    p.add_argument("--first-seed", type=int, default=1)
    p.add_argument("--tasks", type=int, default=5000, help="tasks per run")
    p.add_argument("--rate", type=float, default=None, help="arrivals per second (default: 4 per node)")
    p.add_argument("--arrivals", choices=["poisson", "bursty", "trace"], default="poisson")
    p.add_argument("--trace", default=None, help="trace file (CSV or JSON lines: ts, app, input_size_mb)")
    p.add_argument("--events", choices=["default", "none"], default="default",
                   help="non-stationarity: throttling, noisy neighbour, slowdown")
    p.add_argument("--no-join", action="store_true", help="no GPU node joining mid-run")
    p.add_argument("--out", default="reports/sim", help="output directory")
    p.add_argument("--no-html", action="store_true", help="CSV and JSON only")


def run(args: argparse.Namespace, settings: Any) -> int:
    import sys

    from tqdm import tqdm

    from app.sim.policies import parse_policies
    from app.sim.report import format_goals, format_table, goal_rows, summarise, write_report
    from app.sim.runner import SimConfig, describe, run_offline

    if args.seeds < 1:
        raise SystemExit("rttsched sim: --seeds must be >= 1")
    config = SimConfig(preset=args.preset, n_nodes=args.nodes, n_tasks=args.tasks, rate_per_s=args.rate,
                       arrivals=args.arrivals, trace_path=args.trace, events=args.events,
                       join_node=not args.no_join, scrape_interval_s=settings.scrape_interval_s)
    policies = parse_policies(args.policies)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    runs: dict[str, list[Any]] = {p: [] for p in policies}
    with tqdm(total=len(policies) * len(seeds), file=sys.stderr, unit="run", desc="sim") as bar:
        for seed in seeds:
            for policy in policies:
                bar.set_postfix_str(f"{policy} seed {seed}")
                runs[policy].append(run_offline(config, policy, seed))
                bar.update(1)
    agg = summarise(runs)
    print(format_table(agg))
    goals = goal_rows(agg)
    if goals:
        print()
        print(format_goals(goals))
    paths = write_report(runs, args.out, describe(config), html=not args.no_html)
    print(f"\nwrote {paths.csv}, {paths.json}" + ("" if args.no_html else f", {paths.html}"))
    return 0
