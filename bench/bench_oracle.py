"""rtt_aware's decision path with the simulator's truth in place of its models: how much of the room is theirs.

    python3 bench/bench_oracle.py                                   # default scenario, seeds 1-3
    python3 bench/bench_oracle.py --scenario join --seeds 1,2
    python3 bench/bench_oracle.py --quick                           # seeds 1-2, a quarter of each run

On each seed it runs the baselines that can be the best one (``static_best``, ``kube_default``,
``load_aware``), the clairvoyant reference, ``rtt_aware``, and ``rtt_aware`` twice more with the truth in its
decisions (:class:`Truth`):

* ``true own RTT``: each candidate's predicted RTT replaced by the pod's true service time there if it
  started now and nothing else changed (``ClusterView.clairvoyant_cost``, what the clairvoyant minimises);
* ``true own + slowdown``: the predicted slowdown of the pods running there (``inflicted_ms``) replaced by the
  true one as well.

Everything else is the production decision (:func:`app.scheduler.decide.decide`: scores, credibility,
exploration, the winner) and the production feedback and retrains; only predictions are replaced, so before
a model covers a pod's candidates Kubernetes' default scoring places it as in ``rtt_aware``. With the truth,
the two corrections of the models' own errors are off: the pending-pods penalty (``contention`` 0) and the
residual correction.

Prints per policy its mean RTT on each seed, their mean, and the share of the clairvoyant's gain over the best
baseline (the baseline of lowest mean over these seeds) it gets. A decision path that reaches most of the room
with the truth and much less with the models says the models are what limits it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import numpy as np
from bench_policies import captured_share, shorten
from tqdm import tqdm

import app.scheduler.cycle as cycle_module
import app.scheduler.decide as decide_module
from app.sim.hardware import NodeSpec
from app.sim.policies.rtt_aware import RttAware
from app.sim.runner import run_offline
from app.sim.scenario import load_scenario
from app.sim.scenario_paths import scenario_path
from app.sim.view import ClusterView, Task

BASELINES = ("static_best", "kube_default", "load_aware")
TRUTH_POLICY = {"contention": {"interfering": 0, "other": 0}}


class Truth:
    """While active, :func:`~app.scheduler.decide.decide` called by :class:`TruthAware` takes its predictions
    from the simulator: ``slowdown`` True replaces the inflicted slowdown too."""

    def __init__(self, slowdown: bool) -> None:
        self.slowdown = slowdown
        self.task: Task | None = None
        self.view: ClusterView | None = None
        self.names: list[str] = []
        self._costs: dict[int, tuple[float, float]] = {}  # this decision's true costs, by candidate
        self._saved: dict[str, Any] = {}

    def cost(self, i: int) -> tuple[float, float]:
        """Candidate ``i``'s true (own, inflicted) cost in the decision under way (taken once per decision)."""
        c = self._costs.get(i)
        if c is None:
            assert self.task is not None and self.view is not None
            c = self._costs[i] = self.view.clairvoyant_cost(self.task, self.names[i])
        return c

    def __enter__(self) -> Truth:
        original_predict = decide_module._predict
        original_decide = cycle_module.decide
        self._saved = {"predict": original_predict, "decide": original_decide,
                       "inflicted": decide_module.inflicted_ms}

        def predict(routes: Any, groups: Any, task: Any, features: Any, idle: Any, rtt: np.ndarray, keys: Any,
                    versions: Any, remember: bool = True) -> None:
            original_predict(routes, groups, task, features, idle, rtt, keys, versions, remember)
            for i in np.flatnonzero(np.isfinite(rtt)).tolist():  # the candidates a model covers
                rtt[i] = self.cost(i)[0]

        def decide(snapshot: Any, pod: Any, nodes: Sequence[str], *args: Any, **kwargs: Any) -> Any:
            self.names, self._costs = list(nodes), {}
            return original_decide(snapshot, pod, nodes, *args, **kwargs)

        def inflicted(snapshot: Any, app: str, nodes: Sequence[str], at: Any, candidates: Sequence[int],
                      features: Any, live: Any, now: float, weight: float) -> np.ndarray:
            out = np.zeros(len(nodes))
            for i in candidates:
                out[i] = weight * self.cost(i)[1]
            return out

        decide_module._predict = predict
        cycle_module.decide = decide
        if self.slowdown:
            decide_module.inflicted_ms = inflicted
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        decide_module._predict = self._saved["predict"]
        cycle_module.decide = self._saved["decide"]
        decide_module.inflicted_ms = self._saved["inflicted"]


class TruthAware(RttAware):
    """``rtt_aware`` whose decisions read the simulator's truth through ``truth`` (see :class:`Truth`)."""

    def __init__(self, rng: np.random.Generator, truth: Truth, *, background: bool = True) -> None:
        super().__init__(rng, correction=False, policy=TRUTH_POLICY, background=background)
        self.truth = truth
        self.name = "rtt_aware_truth" + ("" if truth.slowdown else "_own")

    def choose(self, task: Task, candidates: Sequence[NodeSpec], view: ClusterView) -> NodeSpec | None:
        self.truth.task, self.truth.view = task, view
        return super().choose(task, candidates, view)


def room_captured(baseline: float, clairvoyant: float, mean: float) -> float:
    """The share of the clairvoyant's gain over the baseline that ``mean`` gets (NaN: the clairvoyant is not ahead).

    >>> room_captured(150.0, 130.0, 140.0), room_captured(150.0, 130.0, 125.0)
    (0.5, 1.25)
    """
    return captured_share(baseline, clairvoyant, mean, (clairvoyant / baseline - 1.0, 0.0), False)


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated integers (got {text!r})") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"distinct integers (got {text!r})")
    return seeds


def runs() -> dict[str, tuple[Any, Truth | None]]:
    """Per row of the table, what to run: a policy name, or a factory with the truth it needs."""
    own, both = Truth(slowdown=False), Truth(slowdown=True)
    out: dict[str, tuple[Any, Truth | None]] = {p: (p, None) for p in (*BASELINES, "clairvoyant")}
    out["rtt_aware"] = (lambda rng: RttAware(rng), None)
    out["rtt_aware, true own RTT"] = (lambda rng: TruthAware(rng, own), own)
    out["rtt_aware, true own + slowdown"] = (lambda rng: TruthAware(rng, both), both)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="default", help="a name in scenarios/ or a path (default: default)")
    ap.add_argument("--seeds", type=_seeds, default=None, help="seeds (default 1,2,3; --quick: 1,2)")
    ap.add_argument("--quick", action="store_true", help="seeds 1 and 2, a quarter of each run")
    args = ap.parse_args()
    args.seeds = args.seeds or _seeds("1,2" if args.quick else "1,2,3")
    try:
        path = scenario_path(args.scenario)
    except ValueError as exc:
        ap.error(f"--scenario: {exc}")
    config = load_scenario(path).config
    config = shorten(config) if args.quick else config
    todo = runs()
    means: dict[str, list[float]] = {name: [] for name in todo}
    with tqdm(total=len(todo) * len(args.seeds), file=sys.stderr, unit="run", desc=args.scenario) as bar:
        for name, (policy, truth) in todo.items():
            for seed in args.seeds:
                if truth is None:
                    m = run_offline(config, policy, seed)
                else:
                    with truth:
                        m = run_offline(config, policy, seed)
                means[name].append(float(m.rtt_ms[m.ok].mean()))
                bar.update()
    avg = {name: float(np.mean(v)) for name, v in means.items()}
    best = min(BASELINES, key=avg.__getitem__)
    seeds = " / ".join(str(s) for s in args.seeds)
    print(f"== {args.scenario}, seeds {seeds}: mean RTT (ms); room: share of the clairvoyant's gain over the best "
          f"baseline ({best}, {avg[best]:.1f} ms) ==")
    width = max(len(n) for n in todo)
    print(f"{'policy':<{width}}  {'by seed':>{8 * len(args.seeds)}}  {'mean':>7}  {'room':>6}")
    for name, values in means.items():
        share = room_captured(avg[best], avg["clairvoyant"], avg[name])
        room = "–" if name in BASELINES or name == "clairvoyant" or not np.isfinite(share) else f"{share:.0%}"
        print(f"{name:<{width}}  {''.join(f'{v:8.1f}' for v in values)}  {avg[name]:7.1f}  {room:>6}")
    print("(true own RTT / + slowdown: rtt_aware's decisions with the simulator's truth in place of its predictions,"
          " no pending-pods penalty or residual correction; the warm-up before the first models is its own)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
