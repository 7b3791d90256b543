"""The learning path's choices, measured through the simulator's rtt_aware (the production path in process).

    python3 bench/bench_learning.py                 # small preset, 3 seeds x 5000 tasks, every variant
    python3 bench/bench_learning.py --quick         # 2 seeds x 1500 tasks
    python3 bench/bench_learning.py --speed-only --preset large --tasks 20000
    python3 bench/bench_learning.py --scenario pulsing --seeds 5 --no-speed \
        --variants "fixed 5 s window,fixed 30 s window,fixed 60 s window,no residual correction"

Prints, each with the command's settings:

1. **variants**: the production defaults against one change each - squared error instead of ``reg:gamma``,
   every varying column when the vote keeps nothing (``fallback="all"``), no per-measure top-k, cold start
   at 50 or 200 samples, metric columns from the first model on (no ``metric_min_rows``), ranking by the
   pod's own predicted RTT (no inflicted slowdown), no penalty for pods the metrics cannot show yet (or 0.1 a
   pod of another app instead of the deployed policy's 0.3), the deployed policy with the anti-affinity
   pairs it has as an example or without its SLAs, no
   residual correction, no exploration, exploring every node until it has completed 3 tasks of the app
   (``min_samples: 3``), a fixed 5, 30 or 60 s window - mean / p99 / second-half
   RTT, accuracy (1 - MAPE after warm-up) per app x node class, and each one's mean RTT against the
   defaults as a ratio (mean over seeds, 95 % CI of the mean RTT); under them the clairvoyant reference on the
   same seeds, whose accuracy is that of its own estimate at placement (the true work with its noise draw and
   every running task's state, as if nothing else changed): what knowing everything at placement time buys a
   prediction while later arrivals still change the RTT;
2. **DWA vs fixed windows** (those run): prediction RMSE of gCTF and Motioncor2 on GPU nodes after warm-up;
3. **exploration**: its placements, their mean time on the node against every task's, and what turning
   it off does to the mean RTT;
4. **speed**: simulated tasks per second of wall time on ``--speed-preset`` (default large, seed 1), the
   simulation thread's CPU per task, the wall time the retrains ran and the time it waited for them, with the mean
   RTT of each fifth of the run beside kube_default's and the calibrated table's (how long learning takes); and
   rtt_aware's predictions alone (:class:`PredictTimer`): their time per task, the rows asked and walked per
   task, and the tasks/s they would allow if nothing else ran.

``--scenario NAME`` (a file of ``scenarios/``, or a path) runs the variants on that scenario's cluster,
workload and events instead of ``--preset``'s default run, with its own number of tasks unless ``--tasks``
says otherwise; ``--no-speed`` leaves out the speed run.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import numpy as np
from arguments import positive_int
from bench_policies import shorten
from tqdm import tqdm

from app.config import Settings
from app.features.selection import SelectionRule, select_features
from app.model.fast import FastPredictor
from app.scheduler.decide import Decision
from app.sim.hardware import NodeSpec
from app.sim.policies.rtt_aware import RttAware
from app.sim.report.stats import mean_ci
from app.sim.results import RunMetrics
from app.sim.runner import SimConfig, run_offline
from app.sim.scenario import load_scenario
from app.sim.scenario_paths import scenario_path
from app.sim.view import ClusterView, Task

SPEED_GOAL = 3_000.0
RMSE_APPS = ("gCTF", "Motioncor2")


def no_top_k(X: np.ndarray, y: np.ndarray, names: Any) -> Any:
    """The five-measure vote without the per-measure top-k."""
    return select_features(X, y, list(names), SelectionRule()).chosen


VARIANTS: dict[str, dict[str, Any]] = {
    "production defaults": {},
    "squared error": {"train_params": {"objective": "reg:squarederror"}},
    "fallback: all columns": {"train_options": {"fallback": "all"}},
    "vote without top-k": {"train_options": {"selector": no_top_k}},
    "cold start 50": {"settings": {"cold_start_samples": 50}},
    "cold start 200": {"settings": {"cold_start_samples": 200}},
    "metrics from row 1": {"train_options": {"metric_min_rows": 0}},
    "own RTT only": {"policy": {"objective": {"inflicted": 0.0}}},
    "no pending penalty": {"policy": {"contention": {"interfering": 0.5, "other": 0.0}}},
    "pending penalty 0.1": {"policy": {"contention": {"interfering": 0.5, "other": 0.1}}},
    "anti-affinity pairs": {"policy": {"anti_affinity": [["Motioncor2", "Motioncor2"], ["Motioncor2", "gCTF"]]}},
    "no SLA": {"policy": {"sla_ms": {}}},
    "no residual correction": {"correction": False},
    "no exploration": {"explore_share": 0.0},
    "per-node exploration": {"policy": {"exploration": {"min_samples": 3}}},
    "fixed 5 s window": {"dwa": False, "settings": {"feature_window_s": 5.0}},
    "fixed 30 s window": {"dwa": False},
    "fixed 60 s window": {"dwa": False, "settings": {"feature_window_s": 60.0}},
}
FIXED_WINDOWS = {name: name.removeprefix("fixed ").removesuffix(" window")
                 for name in VARIANTS if name.startswith("fixed ")}


def factory(kw: dict[str, Any], windows: list[tuple[str, float]] | None = None,
            ) -> Callable[[np.random.Generator], RttAware]:
    """RttAware with the variant's options; ``windows`` (if given) gets, for every placement of a GPU app on a
    GPU node, (app, the node's feature window for the app at that moment)."""
    kw = dict(kw)
    if "settings" in kw:
        kw["settings"] = Settings(**kw["settings"])

    def make(rng: np.random.Generator) -> RttAware:
        policy = RttAware(rng, **kw)
        if windows is not None:
            def seen(task: Task, decision: Decision, node: NodeSpec, view: ClusterView) -> None:
                tracker = policy.trackers.get(node.name)
                if tracker is not None and node.node_class == "gpu" and task.app in RMSE_APPS:
                    windows.append((task.app, tracker.window(task.app)))
            policy.on_decision = seen
        return policy
    return make


def rmse_on_gpu(m: RunMetrics, app: str) -> float:
    apps = np.array(m.apps)
    ok = np.isfinite(m.predicted_ms) & m.ok & (apps == app) & (m.task_node_class() == "gpu")
    ok &= np.arange(len(apps)) >= len(apps) // 5
    return float(np.sqrt(np.mean((m.predicted_ms[ok] - m.rtt_ms[ok]) ** 2))) if ok.any() else float("nan")


def figures(m: RunMetrics) -> dict[str, float]:
    late = np.arange(len(m.apps)) >= len(m.apps) // 2
    s = m.summary()
    out = {"mean": s["mean_rtt_ms"], "p99": s["p99_rtt_ms"], "tasks": float(len(m.apps)),
           "2nd half": float(m.rtt_ms[late & m.ok].mean()),
           **{k.removeprefix("acc:"): v for k, v in m.accuracy().items()}}
    for app in RMSE_APPS:
        out[f"rmse {app}"] = rmse_on_gpu(m, app)
    notes = m.trace.notes
    out["explored"] = float(notes.get("explored", 0))
    out["explored ms"] = notes.get("explored_service_ms", 0.0) / max(notes.get("explored", 0), 1)
    service = (m.finish_s - m.start_s)[m.ok] * 1000.0
    out["service ms"] = float(service.mean())
    return out


def mean_of(runs: list[dict[str, float]], key: str) -> float:
    vals = [r[key] for r in runs if key in r and np.isfinite(r[key])]
    return float(np.mean(vals)) if vals else float("nan")


def fifths(m: RunMetrics) -> list[float]:
    """Mean RTT (ms) of each fifth of the run's tasks, in arrival order."""
    idx, n = np.arange(len(m.apps)), len(m.apps)
    return [float(m.rtt_ms[m.ok & (idx >= k * n // 5) & (idx < (k + 1) * n // 5)].mean()) for k in range(5)]


class PredictTimer:
    """While active: the wall time, calls and rows of every ``FastPredictor.predict`` made by the thread that
    entered it, and how many of those rows were walked through the trees (not found in the predictor's memory)
    - what the models alone cost a decision (predictions in retrain threads are not counted).

    >>> import numpy as np, xgboost
    >>> b = xgboost.train({"max_depth": 2}, xgboost.DMatrix(np.eye(3, dtype=np.float32), label=[1, 2, 3]), 3)
    >>> p = FastPredictor.from_booster(b)
    >>> with PredictTimer() as w:
    ...     _ = p.predict(np.zeros((5, 3), dtype=np.float32))
    >>> w.rows, w.walked, w.calls, w.seconds > 0
    (5, 1, 1, True)
    """

    def __init__(self) -> None:
        self.seconds, self.rows, self.walked, self.calls = 0.0, 0, 0, 0
        self._thread = 0
        self._original: Any = None

    def __enter__(self) -> PredictTimer:
        self._thread = threading.get_ident()
        self._original = original = FastPredictor.predict
        timer = self

        def predict(predictor: FastPredictor, X: np.ndarray, remember: bool = True) -> np.ndarray:
            if threading.get_ident() != timer._thread:
                return original(predictor, X, remember)  # type: ignore[no-any-return]
            walked, t0 = predictor.walked, time.perf_counter()
            try:
                return original(predictor, X, remember)  # type: ignore[no-any-return]
            finally:
                timer.seconds += time.perf_counter() - t0
                timer.rows += len(X)
                timer.walked += predictor.walked - walked
                timer.calls += 1

        FastPredictor.predict = predict  # type: ignore[method-assign]
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        FastPredictor.predict = self._original  # type: ignore[method-assign]


def speed(preset: str, n_tasks: int) -> None:
    print(f"\n== speed: rtt_aware on the {preset} preset, {n_tasks} tasks (simulated tasks per second of wall time) ==")
    print(f"{'policy':<14}{'wall s':>9}{'tasks/s':>10}{'vs goal 3k':>12}{'CPU ms/task':>12}{'retrains s':>11}"
          f"{'waited s':>9}{'mean ms':>9}   mean ms by fifth of the run")
    models = PredictTimer()
    for policy in ("kube_default", "static_best", "rtt_aware"):
        t0, cpu0 = time.perf_counter(), time.thread_time()
        if policy == "rtt_aware":
            with models:
                m = run_offline(SimConfig(preset=preset, n_tasks=n_tasks), factory({}), 1)
        else:
            m = run_offline(SimConfig(preset=preset, n_tasks=n_tasks), policy, 1)
        dt, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
        print(f"{policy:<14}{dt:>9.1f}{n_tasks / dt:>10.0f}{n_tasks / dt / SPEED_GOAL:>11.2f}x"
              f"{1000 * cpu / n_tasks:>12.3f}{m.trace.notes.get('retrain_s', 0.0):>11.1f}"
              f"{m.trace.notes.get('retrain_wait_s', 0.0):>9.1f}"
              f"{float(m.rtt_ms[m.ok].mean()):>9.1f}   " + " ".join(f"{x:6.1f}" for x in fifths(m)), flush=True)
    print("(CPU ms/task: the simulation thread's CPU per task, retrains in their own threads excluded; retrains s: "
          "the wall time the retrains ran in their thread, on the cores the simulation shares; waited s: wall time "
          "it waited for a retrain still running when its verdict was due)")
    per_task = models.seconds / n_tasks
    print(f"rtt_aware's predictions alone: {1000 * per_task:.3f} ms a task ({models.rows / n_tasks:.0f} rows a task "
          f"in {models.calls / n_tasks:.1f} calls, {models.walked / n_tasks:.0f} of them walked, the rest found in "
          f"the predictors' memory): {1 / max(per_task, 1e-12):,.0f} tasks/s if nothing else ran "
          f"({per_task * SPEED_GOAL:.2f} x the {1000 / SPEED_GOAL:.2f} ms a task the goal allows)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=positive_int, default=None)
    ap.add_argument("--tasks", type=positive_int, default=None)
    ap.add_argument("--preset", choices=["small", "large"], default="small")
    ap.add_argument("--variants", default="all", help="comma-separated names (default all)")
    ap.add_argument("--speed-preset", choices=["small", "large"], default="large")
    ap.add_argument("--speed-tasks", type=positive_int, default=20_000)
    ap.add_argument("--speed-only", action="store_true")
    ap.add_argument("--scenario", default=None, help="a scenario of scenarios/ by name, or a path to one")
    ap.add_argument("--no-speed", action="store_true", help="leave out the speed run")
    args = ap.parse_args()
    if args.speed_only:
        speed(args.preset, args.tasks or args.speed_tasks)
        return 0
    seeds = list(range(1, 1 + (args.seeds or (2 if args.quick else 3))))
    cfg = SimConfig(preset=args.preset)
    where = f"preset {args.preset}"
    if args.scenario:
        try:
            path = scenario_path(args.scenario)
            cfg = load_scenario(path).config
        except ValueError as exc:  # no such file, or a ScenarioError naming the field
            ap.error(f"--scenario: {exc}")
        where = f"scenario {path.stem}"
    closed = cfg.arrivals == "closed"
    if closed:  # a closed loop runs for its duration: --quick a quarter of it, --tasks does not apply
        cfg = shorten(cfg) if args.quick else cfg
    else:
        cfg = dataclasses.replace(cfg, n_tasks=args.tasks or (
            1500 if args.quick else cfg.n_tasks if args.scenario else 5000))
    names = list(VARIANTS) if args.variants == "all" else [v.strip() for v in args.variants.split(",")]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"--variants: unknown {', '.join(map(repr, unknown))}; known: {', '.join(VARIANTS)}")
    names = ["production defaults"] + [n for n in names if n != "production defaults"]  # every ratio's base
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in names}
    base = names[0]
    windows: list[tuple[str, float]] = []  # the defaults' DWA windows at their GPU placements
    with tqdm(total=len(names) * len(seeds), file=sys.stderr, unit="run") as bar:
        for name in names:
            for seed in seeds:
                bar.set_postfix_str(f"{name} seed {seed}")
                runs[name].append(figures(run_offline(cfg, factory(VARIANTS[name], windows if name == base else None),
                                                      seed)))
                bar.update(1)
    reference = [figures(run_offline(cfg, "clairvoyant", seed)) for seed in seeds]

    size = f"{cfg.clients} clients for {cfg.duration_s:g} s" if closed else f"{cfg.n_tasks} tasks"
    print(f"\n== learning-path variants: {where}, {size}, seeds {seeds[0]}..{seeds[-1]} ==")
    accs = sorted({k for rs in runs.values() for r in rs for k in r if k.count(":") == 1})
    head = f"{'variant':<24}{'mean RTT ms':>18}{'vs defaults':>12}{'p99 ms':>9}{'2nd half':>10}"
    print(head + "".join(f"{a:>17}" for a in accs))
    for name in names:
        m, ci = mean_ci([r["mean"] for r in runs[name]])
        change = m / mean_of(runs[base], "mean") - 1.0
        row = f"{name:<24}{m:>10.1f} ± {ci:<5.1f}{change:>+11.1%}{mean_of(runs[name], 'p99'):>9.0f}"
        row += f"{mean_of(runs[name], '2nd half'):>10.1f}" + "".join(f"{mean_of(runs[name], a):>17.3f}" for a in accs)
        print(row)
    m, ci = mean_ci([r["mean"] for r in reference])
    row = f"{'clairvoyant (reference)':<24}{m:>10.1f} ± {ci:<5.1f}{m / mean_of(runs[base], 'mean') - 1.0:>+11.1%}"
    row += f"{mean_of(reference, 'p99'):>9.0f}{mean_of(reference, '2nd half'):>10.1f}"
    print(row + "".join(f"{mean_of(reference, a):>17.3f}" for a in accs))
    print("(accuracy = 1 - MAPE after warm-up; the clairvoyant's is its estimate at placement, knowing the true work "
          "and every running task, as if nothing else changed)")

    fixed = [name for name in FIXED_WINDOWS if name in runs]
    if fixed:
        print("\n== DWA vs fixed windows: prediction RMSE on GPU nodes after warm-up (ms, mean over seeds; "
              "change: DWA against each) ==")
        print(f"{'app':<12}{'DWA':>10}" + "".join(f"{'fixed ' + FIXED_WINDOWS[f]:>13}{'change':>9}" for f in fixed))
        for app in RMSE_APPS:
            d = mean_of(runs[base], f"rmse {app}")
            row = f"{app:<12}{d:>10.1f}"
            for name in fixed:
                f = mean_of(runs[name], f"rmse {app}")
                row += f"{f:>13.1f}{d / f - 1:>+9.1%}"
            print(row)
    if windows:
        print("DWA's window at each GPU placement of the defaults (the node's window for the app, s): "
              + "; ".join(f"{app} 10th percentile / median / 90th "
                          + " / ".join(f"{np.percentile(w, q):.0f}" for q in (10, 50, 90))
                          for app in RMSE_APPS if (w := [v for a, v in windows if a == app])))

    print("\n== exploration (mean over seeds) ==")
    explored, share = mean_of(runs[base], "explored"), mean_of(runs[base], "explored") / mean_of(runs[base], "tasks")
    print(f"explored placements {explored:.0f} ({share:.1%} of tasks), their time on the node "
          f"{mean_of(runs[base], 'explored ms'):.1f} ms against {mean_of(runs[base], 'service ms'):.1f} ms "
          "for all tasks")
    if "no exploration" in runs:
        off = mean_of(runs["no exploration"], "mean")
        print(f"mean RTT with exploration {mean_of(runs[base], 'mean'):.1f} ms, without {off:.1f} ms "
              f"({mean_of(runs[base], 'mean') / off - 1:+.1%})")
    if not args.no_speed:
        speed(args.speed_preset, args.speed_tasks if not args.quick else 5_000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
