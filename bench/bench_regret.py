"""Where rtt_aware's placements differ from a greedy placement that knows the truth, and which term is off.

    python3 bench/bench_regret.py                                  # default scenario, seed 1, second half
    python3 bench/bench_regret.py --scenario join --seed 2 --part all
    python3 bench/bench_regret.py --by-running                     # also: model / true by pods running there
    python3 bench/bench_regret.py --scenario pulsing --by-event    # also: placements by the events' state
    python3 bench/bench_regret.py --quick                          # a quarter of the run

For every placement rtt_aware decides with its models (not one left to Kubernetes' default scoring, not an
explored one), every candidate's true cost in the same state is taken beside the decision's own terms: the
task's true service time if it started there now and the time it would add to the tasks running there, as if
nothing else changed (``ClusterView.clairvoyant_cost``, what the clairvoyant reference minimises). Per app it
prints how often rtt_aware picked the candidate of lowest true cost, the true cost it gave up per placement
(regret), and, over the placements where the two differ, each term on the node picked and on the node of
lowest true cost:

* model − true: the model's own prediction minus the true service time (the true time assumes nothing else
  changes, so a model that learnt what later arrivals add reads above it everywhere: compare the two nodes,
  not the sign);
* correction: the node × app residual factor the prediction is multiplied by (node-weights ``correction``);
* penalty: the pending-pods factor after it (pods the node's metrics cannot show yet, the extender's
  ``contention``);
* slowdown: the predicted time added to the running pods minus the true one.

A term that is off on one side only is what moved the placement.

``--by-running`` adds, per app, hardware (GPU model, or ``cpu``) and number of pods running on the candidate
when the pod was placed (the decision's running-pods features, all apps), the model's prediction over the
true service time (geometric mean) over every candidate and over the nodes picked: how steeply the models
price the pods already there against the truth.

``--by-event`` adds, for rtt_aware, the calibrated table and the clairvoyant on the same run (tasks of the part
chosen, every placement): per app and node that carries one of the scenario's events (a throttle, a neighbour,
a slowdown), the share of the app's tasks that started on that node while none of its events was on and while
one was, and each policy's mean RTT per app: whether a placement follows what the events do to a node.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from bench_policies import shorten
from tqdm import tqdm

from app.scheduler.decide import Decision
from app.sim.events import NodeEvent
from app.sim.hardware import NodeSpec
from app.sim.policies.rtt_aware import RttAware
from app.sim.report.halves import PARTS, half_mask
from app.sim.results import RunMetrics
from app.sim.runner import build_simulation, run_offline
from app.sim.scenario import load_scenario
from app.sim.scenario_paths import scenario_path
from app.sim.view import ClusterView, Task


@dataclass(frozen=True)
class Placement:
    """One placement decided by the models: per candidate, the decision's terms and the true ones."""

    idx: int
    app: str
    picked: int  # index of the node the pod went to
    model_ms: np.ndarray  # the model's own prediction (NaN: none)
    correction: np.ndarray  # residual factor (1: none)
    penalty: np.ndarray  # pending-pods factor (1: none)
    slowdown_ms: np.ndarray  # predicted time added to the running pods
    true_ms: np.ndarray  # true service time if started now, nothing else changing
    true_slowdown_ms: np.ndarray  # true time added to the running pods
    running: np.ndarray = field(default_factory=lambda: np.zeros(0))  # pods running on each candidate (all apps)
    hardware: tuple[str, ...] = ()  # each candidate's GPU model, or "cpu"

    @property
    def best(self) -> int:
        """The candidate of lowest true cost (the first on a tie)."""
        return int(np.argmin(self.true_ms + self.true_slowdown_ms))

    def regret_ms(self) -> float:
        cost = self.true_ms + self.true_slowdown_ms
        return float(cost[self.picked] - cost[self.best])


def placement(task: Task, d: Decision, chosen: NodeSpec, view: ClusterView) -> Placement | None:
    """The record of one decision, or None when the models did not decide it."""
    if d.neutral is not None or d.explored is not None or d.winner is None:
        return None
    n = len(d.nodes)
    corrected = np.array(d.model_rtt_ms, dtype=np.float64)  # the prediction after the residual correction
    correction = np.array(d.correction, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        ok = np.isfinite(corrected) & (corrected > 0)
        penalty = np.where(ok, np.array(d.rtt_ms, dtype=np.float64) / corrected, np.nan)
        model = corrected / correction
    slowdown = np.array(d.inflicted_ms, dtype=np.float64) if d.inflicted_ms else np.zeros(n)
    truth = np.array([view.clairvoyant_cost(task, name) for name in d.nodes], dtype=np.float64).reshape(n, 2)
    running = np.array([sum(f.values()) if f else 0.0 for f in d.features] if d.features else np.zeros(n))
    hardware = tuple(view.node(name).gpu_model or "cpu" for name in d.nodes)
    return Placement(task.idx, task.app, d.nodes.index(chosen.name), model, correction, penalty, slowdown,
                     truth[:, 0], truth[:, 1], running, hardware)


@dataclass(frozen=True)
class AppSummary:
    app: str
    placements: int
    same: float  # share where the node picked is the one of lowest true cost
    regret_ms: float  # mean true cost given up per placement
    differ: int
    model_error_ms: tuple[float, float]  # (node picked, node of lowest true cost), means over `differ`
    correction: tuple[float, float]
    penalty: tuple[float, float]
    slowdown_error_ms: tuple[float, float]
    unpredicted: int  # placements where the node of lowest true cost had no prediction


def _mean(values: Iterable[float]) -> float:
    v = np.array(list(values), dtype=np.float64)
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else float("nan")


def summarise(records: Sequence[Placement]) -> list[AppSummary]:
    """Per app (sorted): :class:`AppSummary` of its placements."""
    out = []
    for app in sorted({r.app for r in records}):
        rs = [r for r in records if r.app == app]
        differ = [r for r in rs if r.picked != r.best]

        def sides(term: Callable[[Placement, int], float]) -> tuple[float, float]:
            return _mean(term(r, r.picked) for r in differ), _mean(term(r, r.best) for r in differ)

        out.append(AppSummary(
            app, len(rs), 1.0 - len(differ) / len(rs), _mean(r.regret_ms() for r in rs), len(differ),
            model_error_ms=sides(lambda r, i: r.model_ms[i] - r.true_ms[i]),
            correction=sides(lambda r, i: r.correction[i]),
            penalty=sides(lambda r, i: r.penalty[i]),
            slowdown_error_ms=sides(lambda r, i: r.slowdown_ms[i] - r.true_slowdown_ms[i]),
            unpredicted=sum(1 for r in differ if not np.isfinite(r.model_ms[r.best]))))
    return out


def table(rows: Sequence[AppSummary]) -> str:
    head = (f"{'app':<12}{'placements':>11}{'same':>7}{'regret ms':>11}{'differ':>8}"
            f"{'model - true ms':>20}{'correction x':>16}{'penalty x':>16}{'slowdown error ms':>20}"
            f"{'no prediction':>15}")
    lines = [head, f"{'':<37}each: node picked / node of lowest true cost"]
    for s in rows:
        lines.append(
            f"{s.app:<12}{s.placements:>11}{s.same:>7.0%}{s.regret_ms:>11.1f}{s.differ:>8}"
            f"{s.model_error_ms[0]:>10.1f} /{s.model_error_ms[1]:>7.1f}{s.correction[0]:>9.2f} /{s.correction[1]:>5.2f}"
            f"{s.penalty[0]:>9.2f} /{s.penalty[1]:>5.2f}{s.slowdown_error_ms[0]:>11.1f} /{s.slowdown_error_ms[1]:>6.1f}"
            f"{s.unpredicted:>15}")
    return "\n".join(lines)


@dataclass(frozen=True)
class SlopeRow:
    app: str
    hardware: str
    running: int
    candidates: int
    ratio: float  # geometric mean of model / true over the candidates in this state
    picked: int
    picked_ratio: float  # the same over the nodes picked in this state (NaN: none)


def by_running(records: Sequence[Placement]) -> list[SlopeRow]:
    """Model over true service time per (app, hardware, pods running there), sorted."""
    every: dict[tuple[str, str, int], list[float]] = {}
    picked: dict[tuple[str, str, int], list[float]] = {}
    for r in records:
        for i, hw in enumerate(r.hardware):
            if not (np.isfinite(r.model_ms[i]) and r.model_ms[i] > 0 and r.true_ms[i] > 0):
                continue
            key = (r.app, hw, int(round(float(r.running[i]))))
            err = float(np.log(r.model_ms[i] / r.true_ms[i]))
            every.setdefault(key, []).append(err)
            if i == r.picked:
                picked.setdefault(key, []).append(err)
    return [SlopeRow(*key, len(v), float(np.exp(np.mean(v))), len(picked.get(key, ())),
                     float(np.exp(np.mean(picked[key]))) if key in picked else float("nan"))
            for key, v in sorted(every.items())]


def slope_table(rows: Sequence[SlopeRow]) -> str:
    lines = [f"{'app':<12}{'hardware':<16}{'running':>8}{'candidates':>12}{'model/true':>12}{'picked':>8}"
             f"{'model/true':>12}"]
    for s in rows:
        lines.append(f"{s.app:<12}{s.hardware:<16}{s.running:>8}{s.candidates:>12}{s.ratio:>12.2f}{s.picked:>8}"
                     f"{s.picked_ratio:>12.2f}")
    return "\n".join(lines)


@dataclass
class EventShare:
    app: str
    node: str
    share: dict[str, tuple[float, float]]  # policy -> (share while no event of the node is on, while one is)


def event_shares(events: Sequence[NodeEvent], runs: dict[str, RunMetrics], keep: np.ndarray,
                 ) -> tuple[list[EventShare], dict[str, dict[str, float]]]:
    """Per app and node carrying one of ``events`` (throttles, neighbours, slowdowns, as the runs resolved
    them), each run's share of the app's tasks started on the node outside and during the node's events; and
    each run's mean RTT per app (tasks kept by ``keep``; the runs share their workload)."""
    events = [e for e in events if e.kind in ("throttle", "neighbour", "slowdown")]
    first = next(iter(runs.values()))
    apps = np.array(first.apps)
    names = sorted(set(first.apps))
    means = {run: {app: float(m.rtt_ms[keep & m.ok & (apps == app)].mean()) for app in names}
             for run, m in runs.items()}
    where = {run: np.array(m.node_names)[m.node_idx] for run, m in runs.items()}  # each task's node
    rows: list[EventShare] = []
    for node in sorted({e.node for e in events}):
        during: dict[str, np.ndarray] = {}  # run -> the tasks that started while one of the node's events was on
        for run, m in runs.items():
            during[run] = np.zeros(len(m.start_s), dtype=bool)
            for e in events:
                if e.node == node:
                    during[run] |= (m.start_s >= e.start_s) & (m.start_s < e.end_s)
        here = {run: where[run] == node for run in runs}  # the tasks that ran on the node
        for app in names:
            mine = keep & (apps == app)
            share = {run: (_share(here[run], mine & ~during[run]), _share(here[run], mine & during[run]))
                     for run in runs}
            rows.append(EventShare(app, node, share))
    rows.sort(key=lambda r: (r.app, r.node))
    return rows, means


def _share(on_node: np.ndarray, tasks: np.ndarray) -> float:
    """The share of ``tasks`` that ran on the node (NaN: no such task)."""
    return float(on_node[tasks].mean()) if tasks.any() else float("nan")


def event_table(rows: Sequence[EventShare], means: dict[str, dict[str, float]]) -> str:
    names = list(means)
    out = [f"{'app':<12}{'node':<12}" + "".join(f"{n + ' off / on':>26}" for n in names)]
    out += [f"{r.app:<12}{r.node:<12}" + "".join(f"{r.share[n][0]:>19.2f} / {r.share[n][1]:<4.2f}" for n in names)
            for r in rows]
    out.append(f"{'mean RTT ms':<24}" + "".join(f"{'':>26}" for _ in names))
    for app in next(iter(means.values())):
        out.append(f"{app:<24}" + "".join(f"{means[n][app]:>26.1f}" for n in names))
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="default", help="a name in scenarios/ or a path (default: default)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--part", default="second", choices=PARTS, help="which tasks count (default: the second half)")
    ap.add_argument("--by-running", action="store_true",
                    help="also model / true by app, hardware and pods running on the candidate")
    ap.add_argument("--by-event", action="store_true",
                    help="also the share of each app on each node carrying events, while they are off and on")
    ap.add_argument("--quick", action="store_true", help="a quarter of the run")
    args = ap.parse_args()
    try:
        path = scenario_path(args.scenario)
    except ValueError as exc:
        ap.error(f"--scenario: {exc}")
    sc = load_scenario(path)
    config = shorten(sc.config) if args.quick else sc.config
    records: list[Placement] = []
    bar = tqdm(total=config.n_tasks or None, file=sys.stderr, unit="task", desc=f"{args.scenario} seed {args.seed}")

    def make(rng: np.random.Generator) -> RttAware:
        policy = RttAware(rng)

        def seen(task: Task, d: Decision, chosen: NodeSpec, view: ClusterView) -> None:
            bar.update(1)
            r = placement(task, d, chosen, view)
            if r is not None:
                records.append(r)

        policy.on_decision = seen
        return policy

    sim = build_simulation(config, make, args.seed)
    sim.run()
    m = sim.metrics()
    bar.close()
    keep = half_mask(len(m.apps), args.part)
    part = [r for r in records if keep[r.idx]]
    print(f"== rtt_aware against the greedy placement that knows the truth: {args.scenario}, seed {args.seed}, "
          f"{args.part if args.part == 'all' else args.part + ' half'} of the tasks "
          f"({len(part)} placements decided by the models) ==")
    print(table(summarise(part)))
    print("(same: the node picked had the lowest true cost; regret: true cost given up per placement; differ: "
          "placements where they are not the same, over which the four terms are averaged; no prediction: of "
          "those, the node of lowest true cost had none)")
    if args.by_running:
        print(f"\n== the model's prediction over the true service time, by the pods running on the candidate "
              f"(geometric means; {args.part if args.part == 'all' else args.part + ' half'}) ==")
        print(slope_table(by_running(part)))
        print("(true: the service time if the task started there now and nothing else changed; a model that "
              "learnt what later arrivals add reads above it)")
    if args.by_event:
        runs = {"rtt_aware": m}
        for name in ("static_best", "clairvoyant"):
            runs[name] = run_offline(config, name, args.seed)
        rows, means = event_shares(sim.events, runs, keep)
        print(f"\n== share of each app's tasks on the nodes that carry events, while none of the node's events is on "
              f"/ while one is ({args.part if args.part == 'all' else args.part + ' half'}; every placement) ==")
        print(event_table(rows, means) if rows else "(the scenario has no throttle, neighbour or slowdown)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
