from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from app.sim.runner import SimConfig, run_offline


@pytest.mark.parametrize("policy", ["kube_default", "random", "load_aware", "target_load", "static_best",
                                    "clairvoyant"])
def test_same_seed_same_run_bit_for_bit(policy):
    cfg = SimConfig(n_tasks=1000, arrivals="bursty")
    a, b = run_offline(cfg, policy, 11), run_offline(cfg, policy, 11)
    assert a.fingerprint() == b.fingerprint()
    assert np.array_equal(a.finish_s, b.finish_s, equal_nan=True)


def test_closed_loop_is_reproducible_and_shares_its_tasks_across_policies():
    cfg = SimConfig(arrivals="closed", clients=8, think_s=0.1, duration_s=30.0, events="none")
    a, b = run_offline(cfg, "kube_default", 5), run_offline(cfg, "kube_default", 5)
    assert a.fingerprint() == b.fingerprint()
    c = run_offline(cfg, "clairvoyant", 5)
    n = min(len(a.apps), len(c.apps))
    assert a.apps[:n] == c.apps[:n] and np.array_equal(a.input_mb[:n], c.input_mb[:n])
    longer = run_offline(dataclasses.replace(cfg, duration_s=60.0), "kube_default", 5)
    assert longer.apps[: len(a.apps)] == a.apps


def test_other_seed_other_run_same_workload_for_all_policies():
    cfg = SimConfig(n_tasks=500)
    a, b = run_offline(cfg, "random", 1), run_offline(cfg, "random", 2)
    assert a.fingerprint() != b.fingerprint()
    c = run_offline(cfg, "clairvoyant", 1)
    assert np.array_equal(a.submit_s, c.submit_s) and a.apps == c.apps
