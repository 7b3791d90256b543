from __future__ import annotations

import numpy as np

from app.sim.runner import SimConfig, run_offline


def test_same_seed_same_run_bit_for_bit():
    cfg = SimConfig(n_tasks=1000, arrivals="bursty")
    for policy in ("kube_default", "random", "load_aware"):
        a, b = run_offline(cfg, policy, 11), run_offline(cfg, policy, 11)
        assert a.fingerprint() == b.fingerprint()
        assert np.array_equal(a.finish_s, b.finish_s, equal_nan=True)


def test_other_seed_other_run_same_workload_for_all_policies():
    cfg = SimConfig(n_tasks=500)
    a, b = run_offline(cfg, "random", 1), run_offline(cfg, "random", 2)
    assert a.fingerprint() != b.fingerprint()
    c = run_offline(cfg, "oracle", 1)
    assert np.array_equal(a.submit_s, c.submit_s) and a.apps == c.apps
