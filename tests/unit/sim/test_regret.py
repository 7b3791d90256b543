"""bench/bench_regret.py: rtt_aware's placements beside the greedy placement that knows the truth."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from bench_regret import Placement, by_running, event_shares, event_table, placement, slope_table, summarise, table

from app.scheduler.decide import Decision
from app.sim.events import EventSpec
from app.sim.hardware import NodeSpec
from app.sim.policies.rtt_aware import RttAware
from app.sim.runner import SimConfig, build_simulation, run_offline
from app.sim.view import ClusterView, Task


def record(app: str, picked: int, model: list[float], true: list[float], true_slowdown: list[float],
           penalty: list[float] | None = None) -> Placement:
    n = len(model)
    return Placement(0, app, picked, np.array(model), np.ones(n), np.array(penalty or [1.0] * n), np.zeros(n),
                     np.array(true), np.array(true_slowdown))


def test_the_lowest_true_cost_counts_both_terms_and_the_terms_are_read_on_each_side() -> None:
    # node 0 is faster for the pod itself, node 1 once the slowdown of its neighbours is counted
    miss = record("gCTF", 0, model=[100.0, 130.0], true=[90.0, 100.0], true_slowdown=[30.0, 0.0],
                  penalty=[1.0, 1.5])
    hit = record("gCTF", 1, model=[100.0, 100.0], true=[90.0, 100.0], true_slowdown=[30.0, 0.0])
    other = record("upload", 0, model=[50.0, 60.0], true=[50.0, 60.0], true_slowdown=[0.0, 0.0])
    assert (miss.best, miss.regret_ms(), hit.regret_ms()) == (1, 20.0, 0.0)
    gctf, upload = summarise([miss, hit, other])
    assert (gctf.app, gctf.placements, gctf.same, gctf.regret_ms, gctf.differ) == ("gCTF", 2, 0.5, 10.0, 1)
    assert gctf.model_error_ms == (10.0, 30.0)  # picked: 100 - 90; lowest true cost: 130 - 100
    assert gctf.penalty == (1.0, 1.5)
    assert gctf.slowdown_error_ms == (-30.0, 0.0)
    assert (upload.same, upload.differ) == (1.0, 0)
    assert math.isnan(upload.model_error_ms[0])  # nothing differs: no term to read
    lines = table([gctf, upload]).splitlines()
    assert lines[2].split()[:5] == ["gCTF", "2", "50%", "10.0", "1"]


def test_model_over_true_is_read_by_app_hardware_and_pods_running_there() -> None:
    def rec(picked: int, model: list[float], true: list[float], running: list[float]) -> Placement:
        n = len(model)
        return Placement(0, "gCTF", picked, np.array(model), np.ones(n), np.ones(n), np.zeros(n), np.array(true),
                         np.zeros(n), np.array(running), ("RTX 4090", "Tesla M40"))

    rows = by_running([rec(0, [200.0, 100.0], [100.0, 100.0], [0.0, 2.0]),
                       rec(1, [50.0, 400.0], [100.0, 100.0], [0.0, 2.0]),
                       rec(1, [100.0, float("nan")], [100.0, 100.0], [1.0, 2.0])])  # no prediction: left out
    got = {(r.hardware, r.running): r for r in rows}
    assert set(got) == {("RTX 4090", 0), ("RTX 4090", 1), ("Tesla M40", 2)}
    assert got[("RTX 4090", 0)].ratio == pytest.approx(1.0)  # geometric mean of 2 and 0.5
    assert (got[("RTX 4090", 0)].picked, got[("RTX 4090", 0)].picked_ratio) == (1, pytest.approx(2.0))
    assert got[("Tesla M40", 2)].ratio == pytest.approx(2.0) and got[("Tesla M40", 2)].picked == 1
    assert got[("RTX 4090", 1)].picked == 0 and math.isnan(got[("RTX 4090", 1)].picked_ratio)
    assert slope_table(rows).splitlines()[1].split() == ["gCTF", "RTX", "4090", "0", "2", "1.00", "1", "2.00"]


def test_a_short_run_records_the_placements_the_models_decided() -> None:
    records: list[Placement] = []
    seen: dict[int, Decision] = {}  # task idx -> its decision (placements come in start order, not arrival order)

    def make(rng: np.random.Generator) -> RttAware:
        policy = RttAware(rng, background=False)

        def hook(task: Task, d: Decision, chosen: NodeSpec, view: ClusterView) -> None:
            seen[task.idx] = d
            r = placement(task, d, chosen, view)
            if r is not None:
                records.append(r)

        policy.on_decision = hook
        return policy

    m = run_offline(SimConfig(n_tasks=800, load=0.5), make, 1)
    assert len(seen) == len(m.apps)  # called once a placement
    neutral = [d for d in seen.values() if d.neutral is not None or d.explored is not None or d.winner is None]
    assert neutral and records and len(records) == len(seen) - len(neutral)  # the first pods: no model yet
    for r in records:
        assert r.app == m.apps[r.idx] and m.node_names[m.node_idx[r.idx]] == seen[r.idx].nodes[r.picked]
        assert np.all(np.isfinite(r.true_ms) & (r.true_ms > 0)) and np.all(r.true_slowdown_ms >= 0)
        assert r.model_ms[r.picked] > 0 and r.penalty[r.picked] >= 1.0
        assert len(r.running) == len(r.hardware) == len(r.model_ms) and np.all(r.running >= 0)
    assert {s.app for s in summarise(records)} <= {"Motioncor2", "gCTF", "upload"}
    assert any(r.running.any() for r in records)  # pods run beside some candidates
    assert {hw for r in records for hw in r.hardware} >= {"RTX 4090", "cpu"}


def test_shares_by_event_follow_the_node_s_events_and_count_each_task_once() -> None:
    """The share of an app's tasks on a node while its events are off and on, per run: counted task by task
    here; a neighbour that triples the RTX 4090's GPU load sends the clairvoyant's gCTF elsewhere while it is on."""
    heavy = EventSpec("neighbour", "worker-3", at=6.0, until=14.0, loads={"gpu": 3.0, "membw": 1.0})
    config = SimConfig(n_tasks=700, load=0.5, events=(heavy, EventSpec("slowdown", "cpu-1", at=20.0, factor=2.0)))
    sim = build_simulation(config, "clairvoyant", 1)
    sim.run()
    runs = {"clairvoyant": sim.metrics(), "kube_default": run_offline(config, "kube_default", 1)}
    keep = np.ones(len(runs["clairvoyant"].apps), dtype=bool)
    keep[:50] = False  # a part: the first 50 tasks left out
    rows, means = event_shares(sim.events, runs, keep)
    assert [(r.app, r.node) for r in rows] == [(a, n) for a in ("Motioncor2", "gCTF", "upload")
                                               for n in ("cpu-1", "worker-3")]
    for r in rows:
        start, end = (6.0, 14.0) if r.node == "worker-3" else (20.0, math.inf)
        for name, m in runs.items():
            counts = {False: [0, 0], True: [0, 0]}  # during -> [on the node, all]
            for i in range(len(m.apps)):
                if keep[i] and m.apps[i] == r.app:
                    during = start <= m.start_s[i] < end
                    counts[during][1] += 1
                    counts[during][0] += m.node_names[m.node_idx[i]] == r.node
            assert r.share[name] == pytest.approx((counts[False][0] / counts[False][1],
                                                   counts[True][0] / counts[True][1]))
    gctf = next(r for r in rows if (r.app, r.node) == ("gCTF", "worker-3"))
    assert gctf.share["clairvoyant"][1] < gctf.share["clairvoyant"][0] - 0.2
    for name, m in runs.items():
        ok = keep & m.ok & (np.array(m.apps) == "upload")
        assert means[name]["upload"] == pytest.approx(float(m.rtt_ms[ok].mean()))
    assert "worker-3" in event_table(rows, means) and "mean RTT ms" in event_table(rows, means)


@pytest.mark.parametrize("argv", [["--scenario", "nope"], ["--part", "third"]])
def test_bad_arguments_are_named(argv: list[str], bench_error: Callable[[str, list[str]], str]) -> None:
    line = bench_error("bench_regret", argv)
    assert line.removeprefix("argument ").startswith(f"{argv[0]}: ") and line.count(argv[0]) == 1  # named once
