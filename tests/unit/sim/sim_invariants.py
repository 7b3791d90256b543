"""Invariant checks shared by the simulator tests."""

from __future__ import annotations

import numpy as np

from app.sim.apps import APPS
from app.sim.policies import BASELINES as BASELINE_NAMES
from app.sim.results import RunMetrics

BASELINES = (*BASELINE_NAMES, "clairvoyant")  # every policy but the learning one (its own tests run it)


def assert_invariants(m: RunMetrics, nodes) -> None:
    """Feasibility as kube-scheduler enforces it: no task on a node that cannot run it (a GPU app never on a
    node without a GPU), never before the node joined, and requests never exceed a node's capacity at any
    instant (per GPU for shares and GPU memory)."""
    by_idx = dict(enumerate(nodes))
    assert (m.node_idx >= 0).sum() + m.failed == len(m.apps)
    events = []
    for i in np.flatnonzero(m.ok):
        node = by_idx[int(m.node_idx[i])]
        app = APPS[m.apps[i]]
        assert app.fits(node, float(m.input_mb[i])), (m.apps[i], node.name, m.input_mb[i])
        assert not app.wants_gpu or node.gpu is not None, (m.apps[i], node.name)
        assert m.start_s[i] >= node.join_at_s - 1e-9
        assert m.finish_s[i] >= m.start_s[i] >= m.submit_s[i]
        p = app.place
        gmem = app.gpu_mem_gb(float(m.input_mb[i]))
        req = np.array([p.cpu_cores, p.mem_gb, p.gpu_share, gmem])
        events.append((float(m.finish_s[i]), 0, node.name, -req))  # releases first at equal times
        events.append((float(m.start_s[i]), 1, node.name, req))
    used = {n.name: np.zeros(4) for n in nodes}
    for _t, _order, name, delta in sorted(events, key=lambda e: (e[0], e[1])):
        used[name] += delta
        n = by_idx[[x.name for x in nodes].index(name)]
        cap = np.array([n.cpu_cores, n.mem_gb, n.gpu_shares, (n.gpu.mem_gb * n.gpu_count) if n.gpu else 0.0])
        assert np.all(used[name] <= cap + 1e-6), (name, used[name], cap)
