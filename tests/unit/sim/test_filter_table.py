"""The cluster's filter compares every active node's free CPU, memory and GPU room at once, from a table the
nodes keep current: the same candidates, in the same order, as asking each node in turn."""

from __future__ import annotations

import dataclasses

import pytest

from app.sim.cluster import Cluster
from app.sim.hardware import NodeSpec
from app.sim.runner import run_offline
from app.sim.scenario import load_scenario
from app.sim.scenario_paths import scenario_path
from app.sim.state import EPS
from app.sim.view import Task


def one_by_one(cluster: Cluster, task: Task) -> list[NodeSpec]:
    """The filter's definition: each active node's own free resources against the task's requests."""
    profile = task.profile
    p = profile.place
    cpu, mem = p.cpu_cores - EPS, p.mem_gb - EPS
    if not p.gpu_share:
        return [rt.spec for rt in cluster._active if rt.free_cpu >= cpu and rt.free_mem >= mem]
    if p.gpu_share == 1:
        need = profile.gpu_mem_gb(task.input_mb) - EPS
        return [rt.spec for rt in cluster._active if rt.gpu_room >= need and rt.free_cpu >= cpu and rt.free_mem >= mem]
    return [rt.spec for rt in cluster._active if profile.fits(rt.spec, task.input_mb)
            and rt.has_room(profile, task.input_mb)]


@pytest.mark.parametrize("scenario", ["saturated", "join"])
def test_the_filter_passes_the_nodes_that_each_have_room(scenario: str, monkeypatch: pytest.MonkeyPatch) -> None:
    filtered = Cluster.candidates
    seen = {"calls": 0, "some_left_out": 0}

    def checked(cluster: Cluster, task: Task) -> list[NodeSpec]:
        got = filtered(cluster, task)
        want = one_by_one(cluster, task)
        assert [n.name for n in got] == [n.name for n in want]
        seen["calls"] += 1
        seen["some_left_out"] += len(want) < len(cluster._active)
        return got

    monkeypatch.setattr(Cluster, "candidates", checked)
    config = dataclasses.replace(load_scenario(scenario_path(scenario)).config, n_tasks=1500)
    run_offline(config, "kube_default", 1)
    assert seen["calls"] >= 1500
    assert seen["some_left_out"] > 0  # full nodes were left out: the table follows starts and ends
