"""Each baseline against its upstream formula, on the upstream tests' own hand-computed examples.

kube_default: kubernetes ``pkg/scheduler/framework/plugins/noderesources/least_allocated_test.go`` and
``balanced_allocation_test.go``; load_aware: scheduler-plugins
``pkg/trimaran/loadvariationriskbalancing/analysis_test.go``; target_load:
``pkg/trimaran/targetloadpacking/targetloadpacking_test.go``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.sim.hardware import cpu_node, gpu_node
from app.sim.policies.kube_default import KubeDefault, balanced_allocation, kube_score, least_allocated
from app.sim.policies.load_aware import lvrb_score
from app.sim.policies.loadwatcher import LoadWatcher
from app.sim.policies.target_load import tlp_score


@pytest.mark.parametrize("requested, allocatable, weights, expected", [
    ([3000, 5000], [4000, 10000], (1, 1), 37),  # "nothing scheduled, resources requested, differently sized"
    ([3000, 5000], [6000, 10000], (1, 1), 50),
    ([6000, 0], [10000, 20000], (1, 1), 70),  # "no resources requested, pods scheduled with resources"
    ([6000, 5000], [10000, 20000], (1, 1), 57),
    ([6000, 10000], [10000, 50000], (1, 1), 60),
    ([6000, 0], [4000, 10000], (1, 1), 50),  # "requested resources exceed node capacity": cpu scores 0
    ([6000, 5000], [4000, 10000], (1, 1), 25),
    ([3000, 5000], [4000, 10000], (1, 2), 41),  # cpu weight 1, memory weight 2
    ([3000, 5000], [0, 0], (1, 1), 0),  # zero node resources
])
def test_least_allocated_matches_upstream(requested, allocatable, weights, expected):
    assert least_allocated([requested], [allocatable], weights).tolist() == [expected]


@pytest.mark.parametrize("requested, allocatable, expected", [
    ([3000, 5000], [4000, 10000], 87),  # std (0.75 - 0.5) / 2 = 0.125
    ([3000, 5000], [6000, 10000], 100),
    ([6000, 5000], [10000, 20000], 82),
    ([6000, 10000], [10000, 20000], 95),
    ([6000, 10000], [10000, 50000], 80),
    ([6000, 0], [6000, 10000], 50),  # "requested resources at node capacity"
    ([6000, 5000], [6000, 10000], 75),
    ([3000, 5000, 4], [3500, 40000, 8], 70),  # three resources: population std
])
def test_balanced_allocation_matches_upstream(requested, allocatable, expected):
    assert balanced_allocation([requested], [allocatable]).tolist() == [expected]


def test_default_profile_adds_both_plugins_with_weight_one():
    assert kube_score([[3000, 5000]], [[4000, 10000]]).tolist() == [37 + 87]


@given(st.lists(st.tuples(st.integers(0, 64_000), st.integers(0, 1 << 40), st.integers(1, 64_000),
                          st.integers(1, 1 << 40)), min_size=1, max_size=20))
def test_vectorised_scores_equal_one_node_at_a_time(rows):
    req = [[a, b] for a, b, _, _ in rows]
    cap = [[c, d] for _, _, c, d in rows]
    together = kube_score(req, cap).tolist()
    assert together == [int(kube_score([r], [c])[0]) for r, c in zip(req, cap, strict=True)]
    assert all(0 <= s <= 200 for s in together)


def test_kube_default_breaks_ties_at_random():
    class View:
        def requested_many(self, names):
            return [0.0] * len(names), [0.0] * len(names)

    from app.sim.view import Task

    nodes = [cpu_node("a"), cpu_node("b"), cpu_node("c", cores=16)]  # a and b tie, c is smaller
    pol = KubeDefault(np.random.default_rng(0))
    picks = {pol.choose(Task(i, "upload", 10.0, 0.0, 0.0), nodes, View()).name for i in range(50)}
    assert picks == {"a", "b"}


@pytest.mark.parametrize("avg, std, req, margin, sensitivity, expected", [
    (40, 36, 10, 1, 1, 57),  # "valid data"
    (-40, 36, 10, 1, 2, 65),  # "negative usedAvg"
    (200, 36, 10, 1, 2, 20),  # "large usedAvg"
    (40, -36, 10, 1, 2, 75),  # "negative usedStdev"
    (40, 120, 10, 1, 2, 25),  # "large usedStdev"
    (40, 36, 10, -1, 1, 75),  # "negative margin"
])
def test_lvrb_matches_upstream(avg, std, req, margin, sensitivity, expected):
    cap = 100.0  # the upstream cases use capacity 100; fractions here
    score = float(lvrb_score(avg / cap, std / cap, req / cap, margin=margin, sensitivity=sensitivity))
    assert int(np.floor(score + 0.5)) == expected


@pytest.mark.parametrize("util, expected", [(0.0, 40), (50.0, 33), (130.0, 0), (40.0, 100), (20.0, 70)])
def test_target_load_packing_matches_upstream(util, expected):
    # "new node" (0 % -> target), "hot node" (target + 10 -> 33), "excess utilization" (> 100 % -> 0)
    assert tlp_score(util) == expected


def test_load_watcher_serves_a_stale_windowed_snapshot():
    w = LoadWatcher(fetch_s=60.0, refresh_s=30.0, window_s=120.0)
    for t in range(0, 400):
        w.observe("n", float(t), cpu=1.0 if t < 100 else 0.0, mem=0.25)
    assert w.stats("n", 0.0).cpu_avg == 1.0  # the fetch at 0 holds the sample at 0 only
    assert w.stats("n", 89.0).window_end == 60.0  # polled at 60, fetched at 60
    s = w.stats("n", 250.0)  # polled at 240, fetched at 240: window (120, 240]
    assert s.window_end == 240.0 and s.cpu_avg == 0.0 and s.mem_avg == 0.25
    assert w.stats("other", 250.0) is None


@pytest.mark.parametrize("kw", [{"fetch_s": 0.0}, {"refresh_s": -1.0}, {"window_s": float("nan")}])
def test_load_watcher_rejects_bad_settings(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        LoadWatcher(**kw)


def test_gpu_app_requests_are_what_the_filter_sees():
    from app.sim.apps import APPS

    gpu, cpu = gpu_node("g", "RTX 4090"), cpu_node("c")
    assert APPS["gCTF"].place.gpu_share == 1 and not APPS["upload"].place.gpu_share
    assert not APPS["gCTF"].fits(cpu, 50.0) and APPS["gCTF"].fits(gpu, 50.0) and APPS["upload"].fits(gpu, 50.0)


def test_trimaran_defaults_keep_upstream_timing_and_knobs():
    from app.sim.policies import make_policy

    for name in ("load_aware", "target_load"):
        w = make_policy(name, np.random.default_rng(0)).watcher
        # load-watcher pkg/watcher/watcher.go: a fetch a minute, 15-minute window; Trimaran collector.go: 30 s
        assert (w.fetch_s, w.refresh_s, w.window_s) == (60.0, 30.0, 900.0)
    la, tl = make_policy("load_aware", np.random.default_rng(0)), make_policy("target_load", np.random.default_rng(0))
    assert (la.margin, la.sensitivity, la.with_defaults, tl.target) == (1.0, 1.0, True, 40.0)


def _fetches(policy: str, monkeypatch) -> list[float]:
    import dataclasses

    from app.sim.runner import run_offline
    from app.sim.scenario import load_scenario
    from app.sim.scenario_paths import scenario_path

    cfg = load_scenario(scenario_path("large")).config
    cfg = dataclasses.replace(cfg, n_tasks=3000)  # about 3 simulated seconds of the 21-second run
    seen: list[float] = []
    fetch = LoadWatcher._fetch

    def spy(self, at):
        seen.append(at)
        fetch(self, at)

    monkeypatch.setattr(LoadWatcher, "_fetch", spy)
    m = run_offline(cfg, policy, 1)
    assert m.policy == policy
    return sorted(set(seen))


def test_upstream_timing_sees_one_fetch_of_a_large_run_and_the_tuned_one_several(monkeypatch):
    assert _fetches("load_aware", monkeypatch) == [0.0]  # the idle cluster, for the whole run
    for name in ("load_aware_tuned", "target_load_tuned"):
        fetched = _fetches(name, monkeypatch)
        assert len(fetched) > 1 and fetched[0] == 0.0


class _View:
    def __init__(self, now: float) -> None:
        self.now = now

    def requested_many(self, names):
        return [0.0] * len(names), [0.0] * len(names)


@pytest.mark.parametrize("name", ["load_aware", "target_load", "load_aware_tuned", "target_load_tuned"])
def test_a_load_reading_changes_the_scores(name):
    from app.sim.policies import make_policy
    from app.sim.view import Task

    pol = make_policy(name, np.random.default_rng(0))
    nodes = [cpu_node("busy"), cpu_node("idle")]
    w = pol.watcher
    t_end = w.fetch_s * 2  # two fetches on, the window holds the readings
    t = 0.0
    while t <= t_end:
        w.observe("busy", t, cpu=0.9, mem=0.5)
        w.observe("idle", t, cpu=0.05, mem=0.5)
        t += min(1.0, w.window_s / 4)
    view, task = _View(t_end + w.refresh_s / 2), Task(1, "upload", 10.0, 0.0, 0.0)
    if name.startswith("load_aware"):
        busy, idle = pol.lvrb(task, nodes, view)
    else:
        busy, idle = (pol._score(task, n, view) for n in nodes)
    assert idle > busy
    assert {pol.choose(task, nodes, view).name for _ in range(3)} == {"idle"}
