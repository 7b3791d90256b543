from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sim_invariants import BASELINES, assert_invariants

from app.sim.policies import PolicyError, make_policy, parse_policies
from app.sim.policies.kube_default import kube_score
from app.sim.policies.load_aware import lvrb_score
from app.sim.runner import SimConfig, build_nodes, build_simulation, run_offline


@pytest.mark.parametrize("policy", BASELINES)
def test_policy_respects_feasibility_and_capacity(policy, small_config):
    sim = build_simulation(small_config, policy, seed=5)
    sim.run()
    m = sim.metrics()
    assert int(m.summary()["tasks"]) == small_config.n_tasks
    assert_invariants(m, sim.cluster.nodes)


def test_capacity_holds_under_overload():
    cfg = SimConfig(n_tasks=600, rate_per_s=400.0, events="none")
    sim = build_simulation(cfg, "round_robin", seed=2)
    sim.run()
    m = sim.metrics()
    assert (m.start_s - m.submit_s).max() > 0.01  # tasks really waited for room
    assert_invariants(m, sim.cluster.nodes)


def test_large_tasks_never_land_on_a_gpu_too_small():
    cfg = SimConfig(n_tasks=400, mix={"Motioncor2": 1.0}, events="none")
    m = run_offline(cfg, "round_robin", seed=4)
    nodes = build_nodes(cfg, 0.0)
    k20c = [i for i, n in enumerate(nodes) if n.gpu_model == "Tesla K20c"][0]
    too_big = m.input_mb > 333.4  # 1 GB + 0.012 GB/MB > 5 GB
    assert too_big.any()
    assert not (m.node_idx[too_big] == k20c).any()


@pytest.mark.parametrize("seed", [1, 2])
def test_oracle_is_not_beaten_beyond_noise(seed):
    cfg = SimConfig(n_tasks=1500)
    means = {p: run_offline(cfg, p, seed).summary()["mean_rtt_ms"] for p in BASELINES}
    others = min(v for p, v in means.items() if p != "oracle")
    assert means["oracle"] <= others * 1.02, means


def test_unknown_policy_is_rejected():
    import numpy as np

    with pytest.raises(PolicyError):
        make_policy("nope", np.random.default_rng(0))
    with pytest.raises(PolicyError):
        parse_policies("oracle,nope")
    assert parse_policies("all")[-1] == "oracle"


@given(st.lists(st.tuples(st.floats(0, 64), st.floats(0.5, 128)), min_size=1, max_size=4))
def test_kube_score_in_range(res):
    assert 0.0 <= kube_score(res) <= 200.0 + 1e-9


@given(st.lists(st.tuples(st.floats(-2, 3), st.floats(-1, 2)), min_size=1, max_size=3))
def test_lvrb_score_in_range(ms):
    assert 0.0 <= lvrb_score(ms) <= 100.0
