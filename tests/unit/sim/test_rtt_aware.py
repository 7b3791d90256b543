"""The RTT-aware policy runs the production pipeline end to end (small models to stay fast)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_invariants import assert_invariants

from app.sim.apps import APPS
from app.sim.policies.learner import RUNNING_PREFIX, ModelBook, direction
from app.sim.policies.rtt_aware import RttAware
from app.sim.runner import SimConfig, build_simulation, run_offline

SMALL = {"n_estimators": 20, "learning_rate": 0.3}
N_TASKS = 2500


class Recording(RttAware):
    """Records, at each decision, the running-pod features of every node against the cluster's truth."""

    def __init__(self, rng: np.random.Generator, **kw) -> None:
        super().__init__(rng, **kw)
        self.seen: list[tuple[str, float, int]] = []  # (node, running_pods features summed, truly running)
        self.first: list[tuple[str, str]] = []  # (app, node) of the first placements

    def choose(self, task, candidates, view):
        snap = self._snapshot(task.app, view.ts)
        if snap is not None:
            for name, node in snap.nodes.items():
                pods = sum(v for k, v in node.features.items() if k.startswith(RUNNING_PREFIX))
                self.seen.append((name, pods, view.running(name)))
        chosen = super().choose(task, candidates, view)
        if len(self.first) < 60:
            self.first.append((task.app, chosen.name))
        return chosen


def _factory(rng, **kw):
    return Recording(rng, select=False, train_params=SMALL, **kw)


@pytest.fixture(scope="module")
def runs():
    cfg = SimConfig(n_tasks=N_TASKS)
    out = []
    for _ in range(2):
        sim = build_simulation(cfg, _factory, seed=7)
        sim.run()
        out.append((sim, sim.metrics()))
    return out


def test_trains_predicts_and_feeds_back(runs):
    sim, m = runs[0]
    pol = sim.policy
    assert any(reason == "initial" for _, _, reason in m.trace.retrains)
    assert any(reason == "growth" for _, _, reason in m.trace.retrains)
    assert {"gCTF:gpu", "Motioncor2:gpu", "upload:gpu"} <= set(pol.book.models)
    pred = m.predicted_ms[np.isfinite(m.predicted_ms)]
    assert len(pred) > 0.8 * N_TASKS and np.all(pred > 0)
    assert m.trace.errors and m.trace.weights and m.trace.windows
    assert all(0.0 <= w <= 1.0 for _, _, w in m.trace.weights)
    assert all(5.0 <= w <= 60.0 for _, _, w in m.trace.windows)


def test_running_pods_are_the_scheduler_view_at_decision_time(runs):
    pol = runs[0][0].policy
    assert len(pol.seen) > 1000
    assert all(pods == running for _, pods, running in pol.seen)


def test_warm_up_places_every_gpu_app_on_every_gpu_node_first(runs):
    sim, _ = runs[0]
    first = sim.policy.first
    gpu_nodes = {n.name for n in sim.cluster.nodes if n.node_class == "gpu" and n.join_at_s == 0}
    for app in ("gCTF", "Motioncor2"):
        placed = [node for a, node in first if a == app]
        assert set(placed[: len(gpu_nodes)]) == gpu_nodes, placed


def test_predicts_service_time_accurately_on_gpu_nodes(runs):
    acc = runs[0][1].accuracy()
    assert acc["acc:gCTF:gpu"] > 0.75 and acc["acc:upload:gpu"] > 0.75, acc


def test_invariants_and_reproducibility(runs):
    (sim, a), (_, b) = runs
    assert_invariants(a, sim.cluster.nodes)
    assert a.fingerprint() == b.fingerprint()


def test_beats_request_based_default_and_the_scrape_only_variant(runs):
    _, m = runs[0]
    kube = run_offline(SimConfig(n_tasks=N_TASKS), "kube_default", 7)
    scrape_only = run_offline(SimConfig(n_tasks=N_TASKS), lambda rng: _factory(rng, running=False), 7)
    assert m.summary()["mean_rtt_ms"] < kube.summary()["mean_rtt_ms"]
    assert m.summary()["mean_rtt_ms"] < scrape_only.summary()["mean_rtt_ms"]
    assert m.accuracy()["acc:gCTF:gpu"] > scrape_only.accuracy()["acc:gCTF:gpu"]


def test_rejects_bad_options():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="min_train"):
        RttAware(rng, min_train=5)
    with pytest.raises(ValueError, match="target"):
        RttAware(rng, target="cubic")


@pytest.fixture(scope="module")
def constrained():
    """A GPU-app model trained on noisy samples with the monotone constraints."""
    rng = np.random.default_rng(3)
    book = ModelBook(select=False, seed=1, train_params={"n_estimators": 40, "max_bin": 64, "device": "cpu"})
    for _ in range(300):
        pods = {f"{RUNNING_PREFIX}{a}": float(rng.integers(0, 4)) for a in APPS}
        f = {**pods, "task_input_size_mb": float(rng.uniform(10, 300)),
             "hw_gpu_fp32_tflops": float(rng.choice([3.5, 82.6])), "cpu_iowait__mean": float(rng.uniform(0, 0.5))}
        load = 1.0 + 0.5 * pods[f"{RUNNING_PREFIX}gCTF"]
        y = (5.0 + f["task_input_size_mb"] * 3.0 / f["hw_gpu_fp32_tflops"]) * load * float(rng.lognormal(0, 0.3))
        book.add("gCTF:gpu", f, y)
    trained = book.train("gCTF:gpu", "gpu", 0.0, gpu_app=True)
    assert trained is not None
    return trained


@settings(max_examples=60, deadline=None)
@given(pods=st.integers(0, 3), more=st.integers(1, 3), mb=st.floats(10, 300), fast=st.booleans(),
       iowait=st.floats(0, 0.5), feature=st.sampled_from([f"{RUNNING_PREFIX}gCTF", f"{RUNNING_PREFIX}upload",
                                                          "task_input_size_mb", "cpu_iowait__mean"]))
def test_more_load_never_predicts_faster(constrained, pods, more, mb, fast, iowait, feature):
    names = constrained.predictor.feature_names
    base = {f"{RUNNING_PREFIX}{a}": float(pods) for a in APPS}
    base.update(task_input_size_mb=mb, hw_gpu_fp32_tflops=82.6 if fast else 3.5, cpu_iowait__mean=iowait)
    bigger = {**base, feature: base[feature] + more * (10.0 if feature == "task_input_size_mb" else 1.0)}
    X = np.array([[r.get(n, np.nan) for n in names] for r in (base, bigger)], dtype=np.float32)
    lo, hi = constrained.predictor.predict(X)
    assert direction(feature, True) == 1
    assert hi >= lo * (1 - 1e-6)


def test_residual_correction_raises_accuracy(runs):
    _, m = runs[0]
    plain = run_offline(SimConfig(n_tasks=N_TASKS), lambda rng: _factory(rng, correct_alpha=None), 7)
    with_corr, without = m.accuracy(), plain.accuracy()
    assert with_corr["acc:gCTF:gpu"] > without["acc:gCTF:gpu"], (with_corr, without)
    assert np.mean(list(with_corr.values())) > np.mean(list(without.values())), (with_corr, without)
