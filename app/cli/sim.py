"""``rttsched sim``: run the policies side by side on the simulated cluster, offline, and write the report."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

HELP = "compare placement policies on the simulated heterogeneous cluster (offline) and write CSV/JSON/HTML"
# flags that describe the cluster and workload; a scenario file replaces them
SETUP_FLAGS = ("preset", "nodes", "tasks", "rate", "load", "arrivals", "trace", "events", "no_join")
MAX_SEED = 2**63  # seeds are below it: the report's JSON holds 64-bit integers
MAX_SEEDS = 10_000  # seeds per command, as a scenario file's (app.sim.scenario.MAX_SEEDS)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", default=None,
                   help="a shipped scenario's name (a file of scenarios/, e.g. default, pulsing) or a scenario file "
                        "(YAML, see docs/simulator.md); replaces the setup flags")
    p.add_argument("--preset", choices=["small", "large"], default=None, help="cluster preset (default small)")
    p.add_argument("--nodes", type=int, default=None,
                   help="node count of the large preset (default 300; the small preset's nodes are fixed)")
    p.add_argument("--policies", default=None, help="'all' (default) or a comma-separated list of policy names")
    p.add_argument("--seeds", type=int, default=None,
                   help=f"number of seeds (default 5, or the scenario's), at most {MAX_SEEDS}: each runs every "
                        "policy once, and the 95 %% interval narrows only as the square root of their number")
    p.add_argument("--first-seed", type=int, default=None,
                   help="the first of consecutive seeds (default 1); with --scenario, as many seeds as it lists "
                        "(or --seeds) from this one instead of its own, e.g. held-out seeds")
    p.add_argument("--tasks", type=int, default=None, help="tasks per run (default 5000)")
    p.add_argument("--rate", type=float, default=None, help="arrivals per second (default: 4 per node)")
    p.add_argument("--load", type=float, default=None, help="arrival rate as a multiple of the cluster's capacity")
    p.add_argument("--arrivals", choices=["poisson", "bursty", "trace"], default=None)
    p.add_argument("--trace", default=None, help="trace file (CSV or JSON lines: ts, app, input_size_mb)")
    p.add_argument("--events", choices=["default", "none"], default=None,
                   help="non-stationarity: throttling, noisy neighbour, slowdown (default: default)")
    p.add_argument("--no-join", action="store_true", default=None, help="no GPU node joining mid-run")
    p.add_argument("--out", default="reports/sim", help="output directory")
    p.add_argument("--no-html", action="store_true", help="CSV and JSON only")



# SimConfig's fields as the flags that set them, for errors
FLAG_OF = {"n_tasks": "--tasks", "n_nodes": "--nodes", "rate_per_s": "--rate", "load": "--load",
           "arrivals": "--arrivals", "trace_path": "--trace", "events": "--events", "preset": "--preset",
           "large_preset.n_nodes": "--nodes"}


def _seed_range(first: int, n: int, flag: str = "--first-seed") -> list[int]:
    """``n`` seeds from ``first``, the last below :data:`MAX_SEED` too (else ``flag`` is named)."""
    from app.errors import ConfigError

    if first + n - 1 >= MAX_SEED:
        raise ConfigError(flag, f"the last seed, {first} + {n} - 1, must be below 2**63")
    return list(range(first, first + n))


def _setup(args: argparse.Namespace, settings: Any) -> tuple[Any, list[int], str]:
    """(SimConfig, seeds, policies) from a scenario file or from the flags."""
    from app.errors import ConfigError
    from app.sim.runner import SimConfig
    from app.sim.scenario import load_scenario
    from app.sim.scenario_paths import scenario_path

    if args.seeds is not None and args.seeds < 1:
        raise ConfigError("--seeds", "must be >= 1")
    if args.seeds is not None and args.seeds > MAX_SEEDS:  # a range of 2**63 seeds ended in MemoryError
        raise ConfigError("--seeds", f"must be <= {MAX_SEEDS} (got {args.seeds})")
    range_flag = "--seeds" if args.first_seed is None else "--first-seed"  # the one given: a range past 2**63
    first = 1 if args.first_seed is None else args.first_seed
    if first < 0:  # numpy seeds are >= 0
        raise ConfigError("--first-seed", f"must be >= 0 (got {first})")
    if first >= MAX_SEED:  # the report's JSON holds 64-bit integers: a larger seed failed after the runs
        raise ConfigError("--first-seed", f"must be below 2**63 (got {first})")
    if args.scenario:
        given = [f"--{f.replace('_', '-')}" for f in SETUP_FLAGS if getattr(args, f) is not None]
        if given:
            raise ConfigError(given[0], "the scenario file describes the cluster and workload; drop the flag")
        try:
            path = scenario_path(args.scenario)
        except ValueError as exc:
            raise ConfigError("--scenario", str(exc)) from None
        sc = load_scenario(path)
        if args.seeds is None and args.first_seed is None:
            seeds = sc.seeds
        else:  # as many as it lists (or --seeds), from --first-seed (or 1)
            seeds = _seed_range(first, len(sc.seeds) if args.seeds is None else args.seeds, range_flag)
        return sc.config, seeds, args.policies if args.policies is not None else sc.policies or "all"
    preset = args.preset or "small"
    if args.nodes is not None and preset != "large":  # the small preset is a fixed cluster: no count to set
        raise ConfigError("--nodes", "a node count applies to the large preset only (add --preset large)")
    if args.rate is not None and args.load is not None:  # as a scenario file's workload.load / rate_per_s
        raise ConfigError("--load", "give --load or --rate, not both")
    if args.trace is not None and args.arrivals != "trace":  # a trace read by nothing
        raise ConfigError("--trace", "a trace file is read with --arrivals trace (add it)")
    try:
        config = SimConfig(preset=preset, n_nodes=args.nodes, n_tasks=5000 if args.tasks is None else args.tasks,
                           rate_per_s=args.rate, load=args.load, arrivals=args.arrivals or "poisson",
                           trace_path=args.trace, events=args.events or "default", join_node=not args.no_join,
                           scrape_interval_s=settings.scrape_interval_s)
        config.base_nodes()  # the cluster, built now rather than in the first run: a bad --nodes fails here
    except ValueError as exc:  # SimConfig.<field>: ... (large_preset.n_nodes: ...) -> the flag that set it
        field, _, message = str(exc).partition(": ")
        flag = FLAG_OF.get(field.removeprefix("SimConfig."))
        raise ConfigError(flag or field, message) from None
    if config.arrivals == "trace":  # read now, as the runs will: a bad file fails here naming the flag
        from app.sim.scenario import check_trace

        check_trace(config, "--trace")
    seeds = _seed_range(first, 5 if args.seeds is None else args.seeds, range_flag)
    return config, seeds, "all" if args.policies is None else args.policies


def run(args: argparse.Namespace, settings: Any) -> int:
    import sys

    from tqdm import tqdm

    from app.cli.flags import writable_dir
    from app.cli.summary import bar_width, output_lines, summary_lines
    from app.errors import ConfigError
    from app.sim.policies import PolicyError, parse_policies
    from app.sim.report import goal_rows, hardware_labels, report_problem, summarise, write_report
    from app.sim.runner import describe, run_offline

    config, seeds, spec = _setup(args, settings)
    try:
        policies = parse_policies(spec)
    except PolicyError as exc:  # a scenario's policies were checked when it was read: this is the flag
        raise ConfigError("--policies", str(exc)) from None
    out = writable_dir(args.out, "--out")  # before the runs: a bad one fails at once, not after them
    if problem := report_problem(out, html=not args.no_html):  # a PermissionError after every run, else
        raise ConfigError("--out", problem)
    runs: dict[str, list[Any]] = {p: [] for p in policies}
    with tqdm(total=len(policies) * len(seeds), file=sys.stderr, unit="run", desc="sim", ncols=bar_width()) as bar:
        for seed in seeds:
            for policy in policies:
                bar.set_postfix_str(f"{policy} seed {seed}")
                runs[policy].append(run_offline(config, policy, seed))
                bar.update(1)
    agg = summarise(runs)
    print("\n".join(summary_lines(agg, goal_rows(agg, closed_loop=config.arrivals == "closed"))))
    info = describe(config)
    if args.scenario:
        info["scenario"] = Path(args.scenario).stem
    if not args.no_html:  # the plots take seconds after the last run
        print("sim: writing the report", file=sys.stderr, flush=True)
    write_report(runs, out, info, html=not args.no_html, hardware=hardware_labels(config))
    print()
    print("\n".join(output_lines(out, not args.no_html)))
    return 0
