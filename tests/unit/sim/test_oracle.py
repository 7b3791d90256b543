"""bench/bench_oracle.py: rtt_aware's decisions with the simulator's truth in place of its predictions."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from bench_oracle import Truth, TruthAware, room_captured

import app.scheduler.cycle as cycle_module
import app.scheduler.decide as decide_module
from app.scheduler.decide import Decision
from app.sim.hardware import NodeSpec
from app.sim.policies.rtt_aware import RttAware
from app.sim.runner import SimConfig, run_offline
from app.sim.view import ClusterView, Task


def decisions(make: Callable[[np.random.Generator], RttAware], truth: Truth | None = None
              ) -> list[tuple[Decision, list[tuple[float, float]]]]:
    """Each decision of a short run with every candidate's true (own, inflicted) cost at that moment."""
    out: list[tuple[Decision, list[tuple[float, float]]]] = []

    def factory(rng: np.random.Generator) -> RttAware:
        policy = make(rng)

        def hook(task: Task, d: Decision, chosen: NodeSpec, view: ClusterView) -> None:
            out.append((d, [view.clairvoyant_cost(task, name) for name in d.nodes]))

        policy.on_decision = hook
        return policy

    if truth is None:
        run_offline(SimConfig(n_tasks=600, load=0.5), factory, 1)
    else:
        with truth:
            run_offline(SimConfig(n_tasks=600, load=0.5), factory, 1)
    return out


def modelled(d: Decision) -> list[int]:
    return [i for i, key in enumerate(d.model_key) if key is not None and math.isfinite(d.model_rtt_ms[i])]


def test_with_the_truth_every_modelled_candidate_is_predicted_its_true_cost_and_the_decision_path_stays() -> None:
    truth = Truth(slowdown=True)
    seen = decisions(lambda rng: TruthAware(rng, truth, background=False), truth)
    own = [(d, i, cost) for d, costs in seen for i in modelled(d) for cost in [costs[i]]]
    assert len(own) > 1000  # models cover most candidates once the first ones are in
    for d, i, cost in own:
        assert d.model_rtt_ms[i] == pytest.approx(cost[0], rel=1e-12)  # no residual correction on the truth
        assert d.rtt_ms[i] == d.model_rtt_ms[i]  # no pending-pods penalty on it either
    priced = [(d.inflicted_ms[i], costs[i][1]) for d, costs in seen if d.inflicted_ms
              for i in range(len(d.nodes)) if d.inflicted_ms[i] > 0]
    assert priced and all(got == pytest.approx(true, rel=1e-12) for got, true in priced)
    assert any(d.neutral is not None or d.winner is None for d, _ in seen)  # the warm-up is rtt_aware's own
    # the production winner: an explored node, else the top-scored passing node of lowest cost among them
    for d, _ in seen:
        if d.winner is not None and d.explored is None:
            top = max(d.score)
            assert d.score[d.winner] == top and d.score.count(top) == 1


def test_the_truth_of_own_time_leaves_the_models_slowdown_and_is_undone_on_exit() -> None:
    original = decide_module._predict, decide_module.inflicted_ms, cycle_module.decide
    truth = Truth(slowdown=False)
    seen = decisions(lambda rng: TruthAware(rng, truth, background=False), truth)
    assert (decide_module._predict, decide_module.inflicted_ms, cycle_module.decide) == original
    own = [(d.model_rtt_ms[i], costs[i][0]) for d, costs in seen for i in modelled(d)]
    assert own and all(got == pytest.approx(true, rel=1e-12) for got, true in own)
    priced = [(d.inflicted_ms[i], costs[i][1]) for d, costs in seen if d.inflicted_ms
              for i in range(len(d.nodes)) if d.inflicted_ms[i] > 0]
    assert priced and any(got != pytest.approx(true, rel=1e-3) for got, true in priced)  # the models' slowdown
    # without the truth the models predict: their own RTT is not the simulator's
    plain = decisions(lambda rng: RttAware(rng, background=False))
    model = [(d.model_rtt_ms[i], costs[i][0]) for d, costs in plain for i in modelled(d)]
    assert model and sum(got != pytest.approx(true, rel=1e-3) for got, true in model) > 0.9 * len(model)


def test_room_captured_is_the_share_of_the_clairvoyants_gain() -> None:
    assert room_captured(150.0, 130.0, 140.0) == pytest.approx(0.5)
    assert room_captured(150.0, 130.0, 155.0) == pytest.approx(-0.25)
    assert math.isnan(room_captured(130.0, 150.0, 140.0))  # the clairvoyant not ahead: no room to share


@pytest.mark.parametrize("argv", [["--scenario", "nope"], ["--seeds", "1,x"], ["--seeds", "1,1"]])
def test_bad_arguments_are_named(argv: list[str], bench_error: Callable[[str, list[str]], str]) -> None:
    line = bench_error("bench_oracle", argv)
    assert line.removeprefix("argument ").startswith(f"{argv[0]}: ") and line.count(argv[0]) == 1  # named once
