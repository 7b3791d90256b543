"""Every policy on every scenario: the figures with 95 % CIs, rtt_aware's ratios, and the simulator's speed.

    python3 bench/bench_policies.py                       # scenarios/*.yaml, each with its seeds (5)
    python3 bench/bench_policies.py --quick               # 2 seeds, short runs, small rtt_aware models
    python3 bench/bench_policies.py --scenarios default,closed-loop --seeds 5 --json out.json
    python3 bench/bench_policies.py --scenarios default,large --first-seed 6   # seeds 6-10, held out
    python3 bench/bench_policies.py --learning            # also DWA vs fixed window
    python3 bench/bench_policies.py --markdown out.json   # markdown tables of a --json file (no runs)

Per scenario it prints (1) mean ± 95 % CI over seeds of every policy's figures, (2) rtt_aware against
kube_default, against the best other baseline of each figure (static_best included, named) and against
the clairvoyant reference - per-seed ratios (the seeds share their workload), mean ± 95 % CI - and how
much room the scenario leaves: the clairvoyant's gain over the best baseline and the share of it
rtt_aware captures. At the end: a summary row per scenario, the same over the second half of each run's
tasks (after the models' warm-up: against the best baseline there, :mod:`app.sim.report.halves`), the same
over the tasks submitted after the scenario's slowdown began (a node slower from then on, no metric showing
it: what adapting is worth; scenarios without one are left out), and every policy's simulated tasks per
second of wall time per scenario against the 10,000 tasks/s goal for baselines on the small preset.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from arguments import positive_int
from tqdm import tqdm

from app.sim.policies import BASELINES, POLICY_NAMES, REFERENCE
from app.sim.policies.rtt_aware import RttAware
from app.sim.report import format_table, summarise
from app.sim.report.halves import after_slowdown, half_mask, part_figures
from app.sim.report.stats import mean_ci
from app.sim.runner import SimConfig, run_offline
from app.sim.scenario import Scenario, load_scenario
from app.sim.scenario_paths import scenario_path, shipped

FIGURES = ("mean_rtt_ms", "p95_rtt_ms", "p99_rtt_ms", "rtt_std_ms", "queue_ms", "throughput", "gpu_util",
           "load_diff", "tasks_per_wall_s")
RATIO_FIGURES = ("mean_rtt_ms", "p99_rtt_ms", "throughput", "gpu_util", "rtt_std_ms", "load_diff")
HIGHER = ("throughput", "gpu_util")
SPEED_GOAL = 10_000.0
QUICK_PARAMS = {"n_estimators": 30, "learning_rate": 0.25}


def shorten(config: SimConfig) -> SimConfig:
    """A --quick version of a scenario's run: a quarter of the tasks or the duration (at least 1,000 tasks)."""
    if config.arrivals == "closed":
        return dataclasses.replace(config, duration_s=max(30.0, config.duration_s / 4))
    return dataclasses.replace(config, n_tasks=max(1000, config.n_tasks // 4))


def describe(sc: Scenario, config: SimConfig) -> str:
    nodes = f"{len(config.nodes)} nodes" if config.nodes else f"{config.preset} preset" + (
        f" ({config.n_nodes} nodes)" if config.n_nodes else "")
    if config.arrivals == "closed":
        load = f"closed loop, {config.clients} clients, think {config.think_s:g} s, {config.duration_s:g} s"
    else:
        rate = f"load {config.load:g}" if config.load else f"{config.rate_per_s or 'default'} /s"
        load = f"{config.arrivals}, {rate}, {config.n_tasks} tasks"
    events = "no events" if not config.events else f"{len(config.events)} events"
    return f"{sc.name}: {nodes}, {load}, {events}"


def paired(figs: dict[str, list[dict[str, float]]], policy: str, base: str, fig: str) -> tuple[float, float]:
    """Mean ± 95 % CI over seeds of ``policy / base - 1`` for ``fig``, seed by seed (``figs``: per policy, each
    seed's figures)."""
    return mean_ci([a[fig] / b[fig] - 1.0 for a, b in zip(figs[policy], figs[base], strict=True) if b[fig]])


def captured_share(base: float, reference: float, ours: float, room: tuple[float, float], higher: bool) -> float:
    """The share of the clairvoyant's gain over the best baseline (means ``reference`` and ``base``) that
    rtt_aware's mean ``ours`` gets: only where the clairvoyant is ahead beyond the seeds' spread (``room``, its
    paired ratio against the baseline, has a 95 % CI that excludes 0); NaN otherwise."""
    ahead = (room[0] - room[1] > 0) if higher else (room[0] + room[1] < 0)
    return (base - ours) / (base - reference) if ahead else float("nan")


def jsonable(row: dict) -> dict:
    """A row with its (mean, CI) tuples as lists, as the ``--json`` file keeps them."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in row.items()}


def best(agg: dict, fig: str) -> str:
    have = [p for p in BASELINES if p in agg and np.isfinite(agg[p][fig]["mean"])]
    pick = max if fig in HIGHER else min
    return pick(have, key=lambda p: agg[p][fig]["mean"])


def ratio_rows(runs: dict[str, list], agg: dict, closed: bool) -> list[dict]:
    figs = {p: [r.summary() for r in rs] for p, rs in runs.items()}
    rows = []
    for fig in RATIO_FIGURES:
        if fig == "throughput" and not closed:
            continue
        b = best(agg, fig)
        row: dict = {"figure": fig, "best_name": b}
        for name, base in (("kube_default", "kube_default"), ("best", b), ("clairvoyant", REFERENCE)):
            row[name] = paired(figs, "rtt_aware", base, fig)
        row["room"] = room = paired(figs, REFERENCE, b, fig)
        row["captured"] = captured_share(agg[b][fig]["mean"], agg[REFERENCE][fig]["mean"],
                                         agg["rtt_aware"][fig]["mean"], room, fig in HIGHER)
        rows.append(row)
    return rows


TASK_PARTS = {  # key in --json -> (the tasks of a run it keeps, what the summary calls it)
    "second_half": (lambda run: half_mask(len(run.apps), "second"),
                    "over the second half of each run's tasks (after the models' warm-up; the best baseline there)"),
    "after_slowdown": (after_slowdown, "over the tasks submitted after the slowdown began (the best baseline there)"),
}


def part_ratios(runs: dict[str, list], keep: Callable[[Any], np.ndarray]) -> dict[str, dict] | None:
    """rtt_aware over the tasks ``keep`` picks from each run (the same tasks in every policy's run of a seed):
    per RTT figure, the best baseline there, rtt_aware against it and the clairvoyant against it (per-seed
    ratios, mean ± 95 % CI), and the share of the clairvoyant's gain rtt_aware gets (only where the clairvoyant is
    ahead beyond the seeds' spread, as in :func:`ratio_rows`). None when it keeps no task of any run."""
    if not any(keep(r).any() for r in runs["rtt_aware"]):
        return None
    late = {p: [part_figures(r, keep(r)) for r in rs] for p, rs in runs.items()}
    out = {}
    for fig in ("mean_rtt_ms", "p99_rtt_ms"):
        means = {p: float(np.mean([s[fig] for s in late[p]])) for p in late}
        b = min((p for p in BASELINES if p in late and np.isfinite(means[p])), key=means.__getitem__)
        room = paired(late, REFERENCE, b, fig) if REFERENCE in late else (float("nan"), float("nan"))
        captured = captured_share(means[b], means.get(REFERENCE, float("nan")), means["rtt_aware"], room, False)
        out[fig] = {"best_name": b, "best": paired(late, "rtt_aware", b, fig), "room": room, "captured": captured,
                    "rtt_aware": means["rtt_aware"], "baseline": means[b],
                    "clairvoyant": means.get(REFERENCE, float("nan"))}
    return out


def pct(x: float) -> str:
    return f"{x:.0%}" if np.isfinite(x) else "-"


def print_ratios(rows: list[dict]) -> None:
    def cell(m_ci: tuple[float, float]) -> str:
        m, ci = m_ci
        return f"{m:+.1%} ± {ci:.1%}" if np.isfinite(m) else "-"

    print(f"{'rtt_aware vs':<14}{'kube_default':>18}{'best other baseline':>34}{'clairvoyant':>18}"
          f"{'room (clairv. vs best)':>24}{'captured':>10}")
    for r in rows:
        print(f"{r['figure']:<14}{cell(r['kube_default']):>18}{cell(r['best']) + ' (' + r['best_name'] + ')':>34}"
              f"{cell(r['clairvoyant']):>18}{cell(r['room']):>24}{pct(r['captured']):>10}")


def markdown(doc: dict) -> str:
    """Compact markdown tables of a ``--json`` file: mean and p99 RTT per scenario and policy, closed-loop
    throughput, rtt_aware's ratios (over whole runs, their second halves, the tasks after a slowdown), simulator
    speed."""
    scen = doc["scenarios"]
    names = list(scen)
    policies = list(next(iter(scen.values()))["policies"])

    def cell(sc: str, p: str, fig: str, fmt: str) -> str:
        d = scen[sc]["policies"].get(p, {}).get(fig)
        return "-" if not d or not np.isfinite(d["mean"]) else f"{d['mean']:{fmt}} ± {d['ci95']:{fmt}}"

    out = []
    for fig, title, fmt in (("mean_rtt_ms", "mean RTT (ms)", ".0f"), ("p99_rtt_ms", "p99 RTT (ms)", ".0f")):
        out += [f"{title}, mean ± 95 % CI over seeds:", "", "| policy | " + " | ".join(names) + " |",
                "|---" * (len(names) + 1) + "|"]
        out += [f"| {p} | " + " | ".join(cell(n, p, fig, fmt) for n in names) + " |" for p in policies]
        out.append("")
    closed = [n for n in names if any(r["figure"] == "throughput" for r in scen[n]["ratios"])]
    if closed:
        out += ["Closed loop: " + ", ".join(closed), "", "| policy | tasks/s | GPU busy | load diff pp | RTT std ms |",
                "|---|---|---|---|---|"]
        n = closed[0]
        out += [f"| {p} | {cell(n, p, 'throughput', '.1f')} | {cell(n, p, 'gpu_util', '.3f')} | "
                f"{cell(n, p, 'load_diff', '.1f')} | {cell(n, p, 'rtt_std_ms', '.0f')} |" for p in policies]
        out.append("")
    out += ["rtt_aware, per-seed ratios (mean ± 95 % CI); room = clairvoyant vs the best baseline:", "",
            "| scenario | mean vs kube_default | mean vs best baseline | p99 vs best baseline | throughput vs best "
            "| vs clairvoyant (mean) | room (mean) | captured |", "|---|---|---|---|---|---|---|---|"]

    def r(x: list[float | None]) -> str:  # JSON keeps NaN as null
        return f"{x[0]:+.1%} ± {x[1] or 0.0:.1%}" if x[0] is not None and np.isfinite(x[0]) else "-"

    for n in names:
        rows = {row["figure"]: row for row in scen[n]["ratios"]}
        m, p99, thr = rows["mean_rtt_ms"], rows["p99_rtt_ms"], rows.get("throughput")
        captured = np.nan if m["captured"] is None else m["captured"]
        out.append(f"| {n} | {r(m['kube_default'])} | {r(m['best'])} ({m['best_name']}) | {r(p99['best'])} "
                   f"({p99['best_name']}) | {r(thr['best']) + ' (' + thr['best_name'] + ')' if thr else '-'} | "
                   f"{r(m['clairvoyant'])} | {r(m['room'])} | {pct(captured)} |")
    intro = {"second_half": "rtt_aware over the second half of each run's tasks (after the models' warm-up), "
                            "against the best baseline there",
             "after_slowdown": "rtt_aware over the tasks submitted after the scenario's slowdown began (no metric "
                               "shows it), against the best baseline there"}
    for part, text in intro.items():
        with_part = [n for n in names if part in scen[n]]
        if not with_part:
            continue
        out += ["", f"{text} (per-seed ratios, mean ± 95 % CI):", "",
                "| scenario | rtt_aware mean ms | mean vs best baseline | p99 vs best baseline | room (mean) "
                "| captured |",
                "|---|---|---|---|---|---|"]
        for n in with_part:
            m, p99 = scen[n][part]["mean_rtt_ms"], scen[n][part]["p99_rtt_ms"]
            captured = np.nan if m["captured"] is None else m["captured"]
            out.append(f"| {n} | {m['rtt_aware']:.1f} | {r(m['best'])} ({m['best_name']}) | {r(p99['best'])} "
                       f"({p99['best_name']}) | {r(m['room'])} | {pct(captured)} |")
    out += ["", "Simulated tasks per second of wall time (mean over seeds):", "",
            "| policy | " + " | ".join(doc["speed"]) + " |", "|---" * (len(doc["speed"]) + 1) + "|"]
    out += [f"| {p} | " + " | ".join(f"{doc['speed'][n][p]:,.0f}" for n in doc["speed"]) + " |" for p in policies]
    return "\n".join(out)


def factory(quick: bool):
    if not quick:
        return "rtt_aware"
    return lambda rng: RttAware(rng, select=False, train_params=QUICK_PARAMS)


def learning_extras(config: SimConfig, seeds: list[int], quick: bool) -> None:
    """rtt_aware with DWA against a fixed 30 s window (bench/bench_learning.py compares the other choices)."""
    params = QUICK_PARAMS if quick else None
    variants: dict[str, dict[str, Any]] = {"rtt_aware": {}, "fixed_30s": {"dwa": False}}
    runs = {name: [run_offline(config, lambda rng, kw=kw: RttAware(rng, select=not quick, train_params=params,
                                                                    **kw), s) for s in seeds]
            for name, kw in tqdm(variants.items(), file=sys.stderr, desc="learning variants")}
    agg = summarise(runs)
    acc = sorted({k for v in agg.values() for k in v if k.startswith("acc:")})
    print("\n== rtt_aware variants on the first scenario (mean ± 95 % CI) ==")
    print(format_table(agg, ("mean_rtt_ms", "p99_rtt_ms", *acc)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 seeds, a quarter of each run, small rtt_aware models")
    ap.add_argument("--scenarios", default=None, help="comma-separated scenario names (default: all)")
    ap.add_argument("--seeds", type=positive_int, default=None, help="seeds per scenario (default: the scenario's)")
    ap.add_argument("--first-seed", type=positive_int, default=None,
                    help="run seeds FIRST.. (e.g. 6 with --seeds 5: seeds 6-10, not the tables' own)")
    ap.add_argument("--policies", default=None, help="comma-separated subset (rtt_aware, clairvoyant always in)")
    ap.add_argument("--json", default=None, help="write every aggregate and ratio to this file")
    ap.add_argument("--learning", action="store_true", help="also rtt_aware with a fixed 30 s window")
    ap.add_argument("--markdown", default=None, metavar="JSON", help="print markdown tables of a --json file and stop")
    args = ap.parse_args()
    if args.markdown:
        try:
            doc = orjson.loads(Path(args.markdown).read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            ap.error(f"--markdown: cannot read {args.markdown}: {getattr(exc, 'strerror', None) or exc}")
        if not isinstance(doc, dict):
            ap.error(f"--markdown: {args.markdown} is not a --json file of this script (no JSON object)")
        print(markdown(doc))
        return 0
    names = args.scenarios.split(",") if args.scenarios else shipped()
    try:
        paths = {n: scenario_path(n) for n in names}
    except ValueError as exc:
        print(f"bench_policies: --scenarios: {exc}", file=sys.stderr)
        return 2
    asked = [p.strip() for p in args.policies.split(",") if p.strip()] if args.policies else []
    unknown = [p for p in asked if p not in POLICY_NAMES]
    if unknown:
        ap.error(f"--policies: unknown {', '.join(map(repr, unknown))}; known: {', '.join(POLICY_NAMES)}")
    policies = list(POLICY_NAMES) if not asked else [p for p in POLICY_NAMES if p in asked
                                                     or p in ("rtt_aware", REFERENCE, "kube_default")]
    scenarios = [load_scenario(paths[n]) for n in names]
    plan = []
    for sc in scenarios:
        n_seeds = args.seeds or (2 if args.quick else len(sc.seeds))
        seeds = (sc.seeds[:n_seeds] if not args.seeds and args.first_seed is None
                 else list(range(args.first_seed or 1, (args.first_seed or 1) + n_seeds)))
        plan.append((sc, shorten(sc.config) if args.quick else sc.config, seeds))
    out: dict[str, dict] = {}
    speed: dict[str, dict[str, float]] = {}
    summary = []
    t_start = time.perf_counter()
    with tqdm(total=sum(len(s) for _, _, s in plan) * len(policies), file=sys.stderr, unit="run") as bar:
        for sc, config, seeds in plan:
            runs: dict[str, list] = {p: [] for p in policies}
            for seed in seeds:
                for p in policies:
                    bar.set_postfix_str(f"{sc.name} {p} seed {seed}")
                    runs[p].append(run_offline(config, factory(args.quick) if p == "rtt_aware" else p, seed))
                    bar.update(1)
            agg = summarise(runs)
            closed = config.arrivals == "closed"
            rows = ratio_rows(runs, agg, closed)
            tqdm.write(f"\n== {describe(sc, config)}; seeds {seeds[0]}..{seeds[-1]} ==", file=sys.stdout)
            print(format_table(agg, FIGURES))
            print()
            print_ratios(rows)
            speed[sc.name] = {p: agg[p]["tasks_per_wall_s"]["mean"] for p in policies}
            mean_row = next(r for r in rows if r["figure"] == "mean_rtt_ms")
            p99_row = next(r for r in rows if r["figure"] == "p99_rtt_ms")
            thr_row = next((r for r in rows if r["figure"] == "throughput"), None)
            parts = {part: part_ratios(runs, keep) if "rtt_aware" in runs else None
                     for part, (keep, _) in TASK_PARTS.items()}
            summary.append((sc.name, mean_row, p99_row, thr_row, parts))
            out[sc.name] = {"config": describe(sc, config), "seeds": seeds, "policies": agg,
                            "ratios": [jsonable(r) for r in rows]}
            out[sc.name].update({part: {f: jsonable(r) for f, r in late.items()}
                                 for part, late in parts.items() if late is not None})
            sys.stdout.flush()
    print(f"\n== summary: rtt_aware, per-seed ratios (mean), {time.perf_counter() - t_start:.0f} s ==")
    print(f"{'scenario':<13}{'vs kube':>9}{'vs best mean':>27}{'vs best p99':>26}{'throughput':>12}"
          f"{'room':>8}{'captured':>10}")
    for name, m, p, t, _ in summary:
        thr = f"{t['best'][0]:+.1%}" if t else "-"
        print(f"{name:<13}{m['kube_default'][0]:>+9.1%}{m['best'][0]:>+11.1%} ({m['best_name']:<13})"
              f"{p['best'][0]:>+11.1%} ({p['best_name']:<12}){thr:>12}{m['room'][0]:>+8.1%}{pct(m['captured']):>10}")
    for part, (_, text) in TASK_PARTS.items():
        lates = [(name, parts[part]) for name, *_, parts in summary if parts[part] is not None]
        if not lates:
            continue
        print(f"\n== summary {text} ==")
        print(f"{'scenario':<13}{'rtt_aware ms':>13}{'vs best mean':>27}{'vs best p99':>26}{'room':>8}{'captured':>10}")
        for name, late in lates:
            m, p = late["mean_rtt_ms"], late["p99_rtt_ms"]
            print(f"{name:<13}{m['rtt_aware']:>13.1f}{m['best'][0]:>+11.1%} ({m['best_name']:<13})"
                  f"{p['best'][0]:>+11.1%} ({p['best_name']:<12}){m['room'][0]:>+8.1%}{pct(m['captured']):>10}")
    print(f"\n== simulated tasks per second of wall time (mean over seeds; goal {SPEED_GOAL:,.0f} for baselines "
          "on the small preset) ==")
    print(f"{'policy':<14}" + "".join(f"{n:>13}" for n in speed))
    for p in policies:
        print(f"{p:<14}" + "".join(f"{speed[n][p]:>13,.0f}" for n in speed))
    if args.learning:
        learning_extras(plan[0][1], plan[0][2], args.quick)
    if args.json:
        Path(args.json).write_bytes(orjson.dumps({"scenarios": out, "speed": speed},
                                                 option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    return 0


if __name__ == "__main__":
    sys.exit(main())
