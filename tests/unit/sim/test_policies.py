from __future__ import annotations

import numpy as np
import pytest
from sim_invariants import BASELINES, assert_invariants

from app.sim.hardware import cpu_node, gpu_node
from app.sim.policies import PolicyError, make_policy, parse_policies
from app.sim.runner import SimConfig, build_nodes, build_simulation, run_offline

# many CPU nodes and two GPU nodes: a policy that ignored the GPU request would find CPU nodes attractive
MOSTLY_CPU = (gpu_node("g1", "Tesla K20c", cores=8, mem_gb=32.0), gpu_node("g2", "RTX 4090"),
              *(cpu_node(f"c{i}") for i in range(6)))


@pytest.mark.parametrize("policy", BASELINES)
def test_policy_respects_feasibility_and_capacity(policy, small_config):
    sim = build_simulation(small_config, policy, seed=5)
    sim.run()
    m = sim.metrics()
    assert int(m.summary()["tasks"]) == small_config.n_tasks
    assert_invariants(m, sim.cluster.nodes)


@pytest.mark.parametrize("policy", BASELINES)
def test_no_policy_puts_a_gpu_app_on_a_cpu_node(policy):
    cfg = SimConfig(nodes=MOSTLY_CPU, n_tasks=600, load=0.9, events="none")
    sim = build_simulation(cfg, policy, seed=3)
    sim.run()
    m = sim.metrics()
    assert_invariants(m, sim.cluster.nodes)
    on_cpu = np.array([m.node_classes[i] == "cpu" for i in m.node_idx])
    gpu_app = np.array([a != "upload" for a in m.apps])
    assert on_cpu[~gpu_app].any() and not on_cpu[gpu_app].any()


def test_capacity_holds_under_overload_and_the_wait_counts():
    cfg = SimConfig(n_tasks=600, load=2.0, events="none")
    sim = build_simulation(cfg, "round_robin", seed=2)
    sim.run()
    m = sim.metrics()
    wait = m.start_s - m.submit_s
    assert wait.max() > 0.5  # tasks really waited in the pending queue
    assert np.all(m.rtt_ms >= wait * 1000.0 - 1e-6)
    assert_invariants(m, sim.cluster.nodes)
    assert m.summary()["queue_ms"] > 0


def test_pending_tasks_are_retried_in_arrival_order_when_room_frees():
    cfg = SimConfig(nodes=(gpu_node("g", "RTX 4090"),), n_tasks=60, rate_per_s=500.0, events="none",
                    mix={"gCTF": 1.0})
    m = run_offline(cfg, "kube_default", seed=1)
    assert int(m.summary()["tasks"]) == 60
    waited = np.flatnonzero(m.start_s > m.submit_s + 1e-9)
    assert len(waited) > 10
    assert np.all(np.diff(m.start_s[waited]) >= -1e-12)  # equal requests: first come, first started


def test_large_tasks_never_land_on_a_gpu_too_small():
    cfg = SimConfig(n_tasks=400, mix={"Motioncor2": 1.0}, events="none")
    m = run_offline(cfg, "round_robin", seed=4)
    nodes = build_nodes(cfg, 0.0)
    k20c = [i for i, n in enumerate(nodes) if n.gpu_model == "Tesla K20c"][0]
    too_big = m.input_mb > 333.4  # 1 GB + 0.012 GB/MB > 5 GB
    assert too_big.any()
    assert not (m.node_idx[too_big] == k20c).any()


def test_a_task_no_node_can_ever_run_fails_without_stopping_the_run():
    cfg = SimConfig(nodes=(gpu_node("g", "Tesla K20c", cores=8, mem_gb=32.0), cpu_node("c")), n_tasks=200,
                    mix={"Motioncor2": 1.0}, events="none")
    m = run_offline(cfg, "kube_default", seed=1)
    assert m.failed == int((m.input_mb > 333.4).sum()) > 0
    assert int(m.summary()["tasks"]) + m.failed == 200


@pytest.mark.parametrize("seed", [1, 2])
def test_clairvoyant_is_a_strong_reference(seed):
    cfg = SimConfig(n_tasks=1500)
    means = {p: run_offline(cfg, p, seed).summary()["mean_rtt_ms"] for p in BASELINES}
    assert means["clairvoyant"] <= min(v for p, v in means.items() if p != "clairvoyant") * 1.02, means


def test_unknown_policy_is_rejected():
    with pytest.raises(PolicyError):
        make_policy("nope", np.random.default_rng(0))
    with pytest.raises(PolicyError):
        parse_policies("clairvoyant,nope")
    assert parse_policies("all")[-1] == "clairvoyant"
    assert "oracle" not in parse_policies("all")
