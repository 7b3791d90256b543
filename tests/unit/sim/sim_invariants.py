"""Invariant checks shared by the simulator tests."""

from __future__ import annotations

import numpy as np

from app.sim.apps import APPS
from app.sim.results import RunMetrics

BASELINES = ("kube_default", "round_robin", "random", "load_aware", "oracle")


def assert_invariants(m: RunMetrics, nodes) -> None:
    """No task on a node that cannot run it; requests never exceed a node's capacity at any instant."""
    by_idx = {i: n for i, n in enumerate(nodes)}
    assert (m.node_idx >= 0).sum() + m.failed == len(m.apps)
    events = []
    for i in np.flatnonzero(m.ok):
        node = by_idx[int(m.node_idx[i])]
        app = APPS[m.apps[i]]
        assert app.fits(node, float(m.input_mb[i])), (m.apps[i], node.name, m.input_mb[i])
        assert m.start_s[i] >= node.join_at_s - 1e-9
        p = app.placement(node)
        gmem = app.gpu_mem_gb(float(m.input_mb[i])) if p.gpu_share else 0.0
        req = np.array([p.cpu_cores, p.mem_gb, p.gpu_share, gmem])
        events.append((float(m.finish_s[i]), 0, node.name, -req))  # releases first at equal times
        events.append((float(m.start_s[i]), 1, node.name, req))
    used = {n.name: np.zeros(4) for n in nodes}
    for _t, _order, name, delta in sorted(events, key=lambda e: (e[0], e[1])):
        used[name] += delta
        n = next(x for x in nodes if x.name == name)
        cap = np.array([n.cpu_cores, n.mem_gb, n.gpu_shares, (n.gpu.mem_gb * n.gpu_count) if n.gpu else 0.0])
        assert np.all(used[name] <= cap + 1e-6), (name, used[name], cap)
