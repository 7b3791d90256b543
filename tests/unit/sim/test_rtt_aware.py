"""The RTT-aware policy runs the production pipeline end to end (small models to stay fast)."""

from __future__ import annotations

import numpy as np
import pytest
from sim_invariants import assert_invariants

from app.sim.policies.rtt_aware import RttAware
from app.sim.runner import SimConfig, build_simulation

SMALL = {"n_estimators": 20, "max_bin": 64}


def _factory(rng):
    return RttAware(rng, select=False, warmup_per_app=30, train_params=SMALL)


@pytest.fixture(scope="module")
def runs():
    cfg = SimConfig(n_tasks=1200)
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
    assert {"gCTF:gpu", "Motioncor2:gpu"} <= set(pol.book.models)
    pred = m.predicted_ms[np.isfinite(m.predicted_ms)]
    assert len(pred) > 500 and np.all(pred > 0)
    assert m.trace.errors and m.trace.weights and m.trace.windows
    assert all(0.0 <= w <= 1.0 for _, _, w in m.trace.weights)
    assert all(5.0 <= w <= 60.0 for _, _, w in m.trace.windows)


def test_invariants_and_reproducibility(runs):
    (sim, a), (_, b) = runs
    assert_invariants(a, sim.cluster.nodes)
    assert a.fingerprint() == b.fingerprint()


def test_beats_request_based_default(runs):
    from app.sim.runner import run_offline

    _, m = runs[0]
    kube = run_offline(SimConfig(n_tasks=1200), "kube_default", 7)
    assert m.summary()["mean_rtt_ms"] < kube.summary()["mean_rtt_ms"]
