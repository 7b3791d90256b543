"""The cluster's capacity for a task mix: the arrival rate it could sustain, for "rate x capacity" workloads.

Per node and app: the most tasks per second the node completes running only that app, as many at once as
its requests allow (``k`` tasks of the mean input size, each slowed by the other ``k - 1`` through the
simulator's own rate model, :class:`app.sim.state.NodeRuntime`): ``max_k k / (work * factor(k))``. The
cluster's capacity is then the largest rate ``lam`` of the mix such that each node can split its time
between apps to serve ``lam * mix[a]`` of every app (a small linear programme). It ignores noise, pair
interference between different apps and queueing, so a real cluster saturates somewhat below it: it is a
yardstick for the offered load, the same for every policy.

>>> from app.sim.hardware import small_preset
>>> round(capacity_per_s(small_preset()), 1)
58.7
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import optimize, stats

from app.sim.apps import APPS
from app.sim.hardware import NodeSpec
from app.sim.state import NodeRuntime
from app.sim.workload import DEFAULT_MIX, INPUT_MB, check_mix

_Q = stats.norm.ppf((np.arange(400) + 0.5) / 400)  # standard-normal quantiles for the mean input size


def mean_input_mb(app: str) -> float:
    med, sigma, lo, hi = INPUT_MB[app]
    return float(np.clip(med * np.exp(sigma * _Q), lo, hi).mean())


def node_rate(node: NodeSpec, app: str) -> float:
    """Tasks/s ``node`` completes running only ``app`` at its best concurrency (0 if it cannot run it)."""
    return _node_rate(dataclasses.replace(node, name="", join_at_s=0.0), app)


@functools.lru_cache(maxsize=1024)
def _node_rate(node: NodeSpec, app: str) -> float:
    profile = APPS[app]
    mb = mean_input_mb(app)
    if not profile.fits(node, mb):
        return 0.0
    rt = NodeRuntime(node, 0)
    work = rt.ideal_ms(profile, mb)
    best = 0.0
    k = 0
    while rt.has_room(profile, mb) and k < 256:
        rt.start(k, profile, mb, work, 0.0)
        k += 1
        service_ms = float(np.mean([r.factor for r in rt.running.values()])) * work
        best = max(best, k / service_ms * 1000.0)
    return best


def unrunnable(nodes: Sequence[NodeSpec], mix: Mapping[str, float]) -> list[str]:
    """The apps of ``mix`` (weight > 0) that none of ``nodes`` can run (a GPU app on CPU nodes only), by name.

    >>> from app.sim.hardware import cpu_node
    >>> unrunnable([cpu_node("c")], {"upload": 1, "gCTF": 1, "Motioncor2": 0})
    ['gCTF']
    """
    return [a for a in sorted(mix) if mix[a] > 0 and not any(APPS[a].fits(n, mean_input_mb(a)) for n in nodes)]


def capacity_per_s(nodes: Sequence[NodeSpec], mix: Mapping[str, float] | None = None) -> float:
    """The largest arrival rate (tasks/s) of ``mix`` the nodes present at the start could sustain."""
    mix = dict(mix or DEFAULT_MIX)
    check_mix(mix)
    apps = [a for a in sorted(mix) if mix[a] > 0]
    base = [n for n in nodes if n.join_at_s <= 0]
    rates = np.array([[node_rate(n, a) for a in apps] for n in base])  # nodes x apps
    for j, a in enumerate(apps):
        if not rates[:, j].any():
            raise ValueError(f"workload.mix: no node can run {a!r}")
    n_nodes, n_apps = rates.shape
    n_x = n_nodes * n_apps  # x[n, a]: share of node n's time on app a; the last variable is lam
    total = sum(mix[a] for a in apps)
    a_ub = np.zeros((n_apps + n_nodes, n_x + 1))
    for j, a in enumerate(apps):  # lam * mix[a] <= sum_n rate[n, a] * x[n, a]
        a_ub[j, j:n_x:n_apps] = -rates[:, j]
        a_ub[j, -1] = mix[a] / total
    for i in range(n_nodes):  # sum_a x[n, a] <= 1
        a_ub[n_apps + i, i * n_apps:(i + 1) * n_apps] = 1.0
    b_ub = np.concatenate([np.zeros(n_apps), np.ones(n_nodes)])
    c = np.zeros(n_x + 1)
    c[-1] = -1.0
    res = optimize.linprog(c, A_ub=a_ub, b_ub=b_ub, bounds=[(0, None)] * (n_x + 1), method="highs")
    if not res.success:  # pragma: no cover - the programme is always feasible (x = 0, lam = 0)
        raise ValueError(f"capacity: {res.message}")
    return float(res.x[-1])
