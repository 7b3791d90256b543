"""The simulator's rtt_aware places a pod as kube-scheduler does with the extender service: filter, then
prioritize over the nodes that passed (none passed: pending; one: bound without prioritize, and assumed)."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
import xgboost

from app.clock import ManualClock
from app.config import Settings
from app.extender.protocol import parse_args
from app.extender.service import ExtenderService
from app.model.fast import FastPredictor
from app.scheduler.builder import SnapshotBuilder
from app.scheduler.policy import policy_from_dict
from app.sim.hardware import small_preset
from app.sim.policies.extender_http import pod_json
from app.sim.policies.rtt_aware import RttAware, shipped_policy
from app.sim.policies.training import Champion
from app.sim.state import NodeRuntime
from app.sim.view import ClusterView, Task

T0, NOW = 1_700_000_000.0, 100.0
TS = T0 + NOW
# a filter rule of each kind: two Motioncor2 or a Motioncor2 and a gCTF never share a node
RULES: dict[str, Any] = {**shipped_policy(), "anti_affinity": [["Motioncor2", "Motioncor2"], ["Motioncor2", "gCTF"]],
                         "sla_ms": {"gCTF": 8000}}
SPECS = {s.name: s for s in small_preset()[:3]}


@pytest.fixture(scope="module")
def predictor() -> FastPredictor:
    """gCTF's RTT = 100 × x."""
    X = np.array([[1.0], [1.05], [1.5], [2.0]] * 20, dtype=np.float32)
    b = xgboost.train({"max_depth": 3, "base_score": 0.0, "eta": 1.0},
                      xgboost.DMatrix(X, label=X[:, 0] * 100, feature_names=["x"]), 30)
    return FastPredictor.from_booster(b)


def feed(builder: SnapshotBuilder, xs: dict[str, float], creds: dict[str, float], predictor: FastPredictor) -> None:
    for n, x in xs.items():
        builder.apply_node_features({"node": n, "ts": TS - 0.5, "node_class": "gpu", "gpu_model": SPECS[n].gpu_model,
                                     "window_s": 30, "count": 30, "features": {"x": x}})
        builder.apply_node_weights({"node": n, "ts": TS - 0.5, "weight": creds.get(n, 0.5), "predicted_rtt_ms": {},
                                    "stale": False, "node_class": "gpu", "gpu_model": SPECS[n].gpu_model})
    builder.set_model("gCTF:gpu", 1, predictor)


def simulated(case: tuple[Any, ...], predictor: FastPredictor) -> tuple[str | None, int]:
    xs, creds, prior, app, cands = case
    p = RttAware(np.random.default_rng(1), policy=RULES)
    feed(p.builder, xs, creds, predictor)
    p.models["gCTF:gpu"] = (1, Champion(predictor, None))
    p.snap = p.builder.build(TS)
    for tid, a, n, t in prior:
        p.assumed.assume(tid, a, n, t)
    view = ClusterView({n: NodeRuntime(s, i) for i, (n, s) in enumerate(SPECS.items())}, lambda: NOW, T0)
    chosen = p.choose(Task(42, app, 100.0, NOW, 0.0), [SPECS[c] for c in cands], view)
    return (chosen.name if chosen is not None else None), len(p.assumed)


def served(case: tuple[Any, ...], predictor: FastPredictor) -> tuple[str | None, int]:
    """What kube-scheduler does with the extender service's answers (the top score when several nodes pass)."""
    xs, creds, prior, app, cands = case
    svc = ExtenderService(Settings(), policy=policy_from_dict(RULES), clock=ManualClock(TS), publish=False,
                          kafka=False, redis=False)
    feed(svc.builder, xs, creds, predictor)
    svc.rebuild(force=True)
    for tid, a, n, t in prior:
        svc.assumed.assume(tid, a, n, t)
    pod = pod_json("t0000042", app, 100.0)
    passing = orjson.loads(svc.filter(parse_args(orjson.dumps({"Pod": pod, "NodeNames": cands}),
                                                 keep_nodes=True)))["NodeNames"]
    if len(passing) <= 1:
        return (passing[0] if passing else None), len(svc.assumed)
    scores = orjson.loads(svc.prioritize(parse_args(orjson.dumps({"Pod": pod, "NodeNames": passing}))))
    top = max(s["Score"] for s in scores)
    (host,) = [s["Host"] for s in scores if s["Score"] == top]
    return host, len(svc.assumed)


CASES = {
    # worker-3 (100 ms) fails anti-affinity; scored over the other two, worker-1 (200 ms, credibility 0.9) wins
    # against worker-2 (150 ms, credibility 0.2); scored with worker-3 among them, worker-2 would
    "scores over the nodes that passed": (
        {"worker-1": 2.0, "worker-2": 1.5, "worker-3": 1.0}, {"worker-1": 0.9, "worker-2": 0.2, "worker-3": 0.9},
        [("prev", "Motioncor2", "worker-3", TS - 10)], "gCTF", ["worker-1", "worker-2", "worker-3"]),
    "every node fails: pending": (
        {"worker-1": 2.0, "worker-2": 1.5, "worker-3": 1.0}, {}, [("prev", "Motioncor2", "worker-3", TS - 10)],
        "gCTF", ["worker-3"]),
    "one node passes: bound and assumed, no model needed": (
        {"worker-1": 1.0, "worker-2": 1.05}, {}, [], "Motioncor2", ["worker-1"]),
    "every node passes: prioritize decides as the filter did": (
        {"worker-1": 2.0, "worker-2": 1.5, "worker-3": 1.0}, {"worker-1": 0.9, "worker-2": 0.2, "worker-3": 0.9},
        [], "gCTF", ["worker-1", "worker-2", "worker-3"]),
    "one of two passes": (
        {"worker-1": 1.0, "worker-2": 1.05}, {}, [("prev", "Motioncor2", "worker-1", TS - 2)], "gCTF",
        ["worker-1", "worker-2"]),
}
EXPECTED = {"scores over the nodes that passed": ("worker-1", 2), "every node fails: pending": (None, 1),
            "one node passes: bound and assumed, no model needed": ("worker-1", 1),
            "every node passes: prioritize decides as the filter did": ("worker-3", 1),
            "one of two passes": ("worker-2", 2)}


@pytest.mark.parametrize("name", list(CASES))
def test_the_simulated_extender_places_as_kube_scheduler_with_the_service(name: str, predictor: FastPredictor) -> None:
    assert simulated(CASES[name], predictor) == served(CASES[name], predictor) == EXPECTED[name]


def test_a_pod_every_node_refuses_waits_and_runs_after_a_completion() -> None:
    """Only Motioncor2 on a one-GPU-node cluster, two Motioncor2 never on one node: the second waits for the
    first to end (its RTT holds the wait), and every task completes."""
    from app.sim.runner import SimConfig, run_offline

    def factory(rng: np.random.Generator) -> RttAware:
        return RttAware(rng, policy={"anti_affinity": [["Motioncor2", "Motioncor2"]]})

    cfg = SimConfig(n_tasks=40, mix={"Motioncor2": 1.0}, rate_per_s=20.0, events="none", join_node=False,
                    nodes=tuple(s for s in small_preset() if s.name == "worker-3"))
    m = run_offline(cfg, factory, seed=1)
    assert int(m.ok.sum()) == 40
    starts = np.sort(m.start_s)
    ends = np.sort(m.finish_s)
    assert np.all(starts[1:] >= ends[:-1] - 1e-9)  # never two at once



class Asking(RttAware):
    """rtt_aware that puts every pod through a cycle, refused before or not."""

    def choose(self, task: Task, candidates: Any, view: ClusterView) -> Any:
        self._refused_in = None
        return super().choose(task, candidates, view)


def test_pods_refused_while_nothing_changed_get_the_same_answer_without_asking_again(monkeypatch) -> None:
    """The simulated extender answers a pod the filter left no node, asked again in the same state (the cluster
    tries every waiting pod at each completion), without a second cycle: the run is the same to the bit as one
    that asks every time, in fewer cycles."""
    import dataclasses

    import app.sim.policies.rtt_aware as module
    from app.sim.runner import run_offline
    from app.sim.scenario import load_scenario
    from app.sim.scenario_paths import scenario_path

    cycles = [0]
    schedule = module.schedule

    def counted(*a: Any, **k: Any) -> Any:
        cycles[0] += 1
        return schedule(*a, **k)

    monkeypatch.setattr(module, "schedule", counted)
    cfg = dataclasses.replace(load_scenario(scenario_path("saturated")).config, n_tasks=400)
    pairs = {"anti_affinity": [["Motioncor2", "Motioncor2"], ["Motioncor2", "gCTF"]]}
    a = run_offline(cfg, lambda rng: RttAware(rng, policy=pairs), seed=1)
    cached, cycles[0] = cycles[0], 0
    b = run_offline(cfg, lambda rng: Asking(rng, policy=pairs), seed=1)
    assert a.fingerprint() == b.fingerprint()
    assert 400 < cached < cycles[0] / 2, (cached, cycles[0])
