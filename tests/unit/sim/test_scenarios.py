"""Scenario files: the shipped ones load and run; a bad one stops with one line naming the field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from app.cli.main import main
from app.sim.runner import build_simulation, run_offline
from app.sim.scenario import ScenarioError, load_scenario, parse_scenario

SCENARIOS = sorted((Path(__file__).parents[3] / "scenarios").glob("*.yaml"))
SHIPPED = {"default", "bursty", "saturated", "closed-loop", "degrade", "join", "large", "pulsing"}


def _short(config):
    if config.arrivals == "closed":
        return dataclasses.replace(config, duration_s=15.0)
    return dataclasses.replace(config, n_tasks=400 if config.preset == "small" else 1500)


def test_every_promised_scenario_is_shipped():
    assert {load_scenario(p).name for p in SCENARIOS} >= SHIPPED


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_shipped_scenario_runs(path):
    sc = load_scenario(path)
    assert sc.description and len(sc.seeds) >= 5
    m = run_offline(_short(sc.config), "kube_default", sc.seeds[0])
    s = m.summary()
    assert s["tasks"] > 0 and np.isfinite(s["mean_rtt_ms"]) and s["throughput"] > 0


SCRIPTED = [p for p in SCENARIOS if not isinstance(e := load_scenario(p).config.events, str) and e]


@pytest.mark.parametrize("path", SCRIPTED, ids=lambda p: p.stem)
def test_a_shipped_scenario_s_events_happen(path):
    """Each scripted event shows in the tasks: a joining node runs tasks, none before it joins; a throttle or
    slowdown stretches the tasks that run within it on its node by its factor (service time against the
    task's work at the node's own speed); a noisy neighbour stretches them more than outside it."""
    sc = load_scenario(path)
    sim = build_simulation(_short(sc.config), "kube_default", sc.seeds[0])
    sim.run()
    m = sim.metrics()
    names = list(m.node_names)
    stretch = (m.finish_s - m.start_s) * 1000.0 / m.work_ms
    checked = 0
    for node in sim.cluster.nodes:
        if node.join_at_s > 0:
            on = m.node_idx == names.index(node.name)
            assert on.sum() > 0 and m.start_s[on].min() >= node.join_at_s, node.name
            checked += 1
    for ev in sim.events:
        on = m.node_idx == names.index(ev.node)
        during = on & (m.start_s >= ev.start_s) & (m.finish_s <= ev.end_s)
        outside = on & ((m.finish_s <= ev.start_s) | (m.start_s >= ev.end_s))
        if not during.any() or not outside.any():
            continue  # the short run put no task on the node on one side of it
        inside, before_after = float(np.median(stretch[during])), float(np.median(stretch[outside]))
        if ev.kind in ("throttle", "slowdown"):
            assert inside >= 0.9 * ev.factor and inside > before_after, (ev, inside, before_after)
        elif ev.kind == "neighbour":
            assert inside > 1.2 * before_after, (ev, inside, before_after)
        checked += 1
    assert checked >= 1  # every scenario with events shows at least one of them


@pytest.mark.parametrize("text, field", [
    ("name: x\n", "workload"),
    ("name: x\nworkload: {kind: poisson, load: -1}\n", "workload.load"),
    ("name: x\nworkload: {kind: fast}\n", "workload.kind"),
    ("name: x\nworkload: {kind: closed, clients: 3}\n", "workload.clients"),
    ("name: x\nworkload: {kind: poisson, load: 1, rate_per_s: 3}\n", "workload.load"),
    ("name: x\nworkload: {kind: poisson}\ncluster: {nodes: 300}\n", "cluster.nodes"),
    ("name: x\nworkload: {kind: poisson}\napps: {gCTF: 1, ctffind: 1}\n", "apps"),
    ("name: x\nworkload: {kind: poisson}\nevents: [{kind: slowdown, node: nope, at: 1}]\n", "events[0].node"),
    ("name: x\nworkload: {kind: poisson}\nevents: [{kind: throttle, node: cpu-1, at: 1, factor: 0.5}]\n",
     "events[0].factor"),
    ("name: x\nworkload: {kind: poisson}\nevents: [{kind: slowdown, node: cpu-1, at: 10%, until: 20}]\n",
     "events[0].until"),
    ("name: x\nworkload: {kind: poisson}\nevents: [{kind: join, node: n9, at: 10}]\n", "events[0].spec"),
    ("name: x\nworkload: {kind: poisson}\nevents: [{kind: slowdown, node: cpu-1, at: 150%, factor: 2}]\n",
     "events[0].at: must be at most 100% of the run (got 150%)"),
    ("name: x\nworkload: {kind: poisson}\nevents: [{kind: slowdown, node: cpu-1, at: 10%, until: 100.5%}]\n",
     "events[0].until: must be at most 100% of the run (got 100.5%)"),
    ("name: x\nworkload: {kind: poisson}\nevents: [{kind: join, node: n9, at: 1, spec: {class: gpu, gpu: H900}}]\n",
     "events[0].spec"),
    ("name: x\nworkload: {kind: poisson}\ncluster: {nodes: [{class: cpu, gpu: RTX 4090}]}\n", "cluster.nodes[0]"),
    ("name: x\nworkload: {kind: poisson}\npolicies: kube_default,nope\n", "policies"),
    ("name: x\nworkload: [1\n", "line 3"),
    ("name: x\nworkload: {kind: poisson}\napps: {gCTF: 1}\ncluster: {nodes: [{class: cpu}]}\n",
     "apps: no node can run 'gCTF'"),
    ("name: x\nworkload: {kind: poisson, load: 0.5}\ncluster: {nodes: [{class: cpu}]}\n",
     "apps: no node present at the start (load is a multiple of their capacity) can run 'Motioncor2' (it is in the "
     "default mix: give apps)"),
    ("name: x\nworkload: {kind: poisson}\napps: {upload: 0}\n", "apps: weights must be >= 0 and not all 0"),
    ("name: x\nworkload: {kind: poisson, load: .inf}\n", "workload.load: must be a finite number (got inf)"),
    ("name: x\nworkload: {kind: closed, clients: 2, duration_s: .inf}\n", "workload.duration_s: must be a finite"),
    ("name: x\nworkload: {kind: poisson}\nevents: [{kind: slowdown, node: cpu-1, at: 1, factor: .inf}]\n",
     "events[0].factor: must be a finite number"),
    ("name: x\nworkload: {kind: poisson}\nscrape_interval_s: .nan\n", "scrape_interval_s: must be a finite number"),
    ("name: x\nworkload: {kind: poisson}\nseeds: [3, -1]\n", "seeds[1]: must be >= 0 (got -1)"),
    ("name: x\nworkload: {kind: poisson}\nseeds: [1, 2, 1]\n", "seeds[2]: 1 is given twice (each seed runs once)"),
    ("name: x\nworkload: {kind: poisson}\nseeds: [1, 99999999999999999999999]\n",
     "seeds[1]: must be below 2**63 (got 99999999999999999999999)"),
    ("name: x\nworkload: {kind: poisson}\nseeds: 9223372036854775808\n",
     "seeds: must be <= 10000 (got 9223372036854775808)"),
    ("name: x\nworkload: {kind: poisson}\npolicies: random,random\n",
     "policies: 'random' is named twice (each policy runs once per seed)"),
])
def test_bad_scenario_names_the_field_in_one_line(tmp_path, capsys, text, field):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    msg = str(err.value)
    assert field in msg and str(path) in msg and "\n" not in msg
    assert main(["sim", "--scenario", str(path)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and field in out.err and "Traceback" not in out.err


NODES = "name: x\nworkload: {kind: poisson, load: 0.5}\ncluster: {nodes: [%s, {class: cpu}]}\n"
NODE_KEYS = "name, class, gpu, gpus, slots, cores, mem_gb, disk_mb_s, count"


@pytest.mark.parametrize("text, line", [
    (NODES % "{class: gpu, gpu: RTX 4090, gpu_count: 2}",
     f"cluster.nodes[0]: unknown key 'gpu_count' (known: {NODE_KEYS})"),
    (NODES % "{class: gpu, gpu: RTX 4090, count: -1}", "cluster.nodes[0].count: must be >= 1 (got -1)"),
    (NODES % "{class: gpu, gpu: RTX 4090, cores: 0}", "cluster.nodes[0].cores: must be >= 1 (got 0)"),
    (NODES % "{gpu: RTX 4090}", "cluster.nodes[0].class: is required"),
    ("name: x\nworkload: {kind: poisson}\ncluster: {nodes: 2, preset: large}\n",
     "cluster.nodes: must be >= 4 (got 2)"),
    ("name: x\nworkload: {kind: poisson}\ncluster: {nodes: many}\n",
     "cluster.nodes: must be a node count (the large preset) or a list of nodes (got 'many')"),
    ("name: x\nworkload: {kind: poisson}\nseeds: '3'\n",
     "seeds: must be a count of seeds (1 to it) or a list of seeds (got '3')"),
    ("name: x\nworkload: {kind: poisson}\nseeds: true\n",
     "seeds: must be a count of seeds (1 to it) or a list of seeds (got True)"),
    ("name: x\nworkload: {kind: poisson}\nseeds: -2\n", "seeds: must be >= 1 (got -2)"),
    ("name: x\nworkload: {kind: poisson}\nseeds: [1, x]\n", "seeds[1]: must be an integer (got 'x')"),
    ("name: x\nworkload: {kind: poisson}\nseeds: []\n", "seeds: must not be empty"),
    ("name: x\nworkload: {kind: poisson}\napps: {}\n", "apps: must not be empty"),
    ("name: \"\"\nworkload: {kind: poisson}\n", "name: must not be empty (got '')"),
    ("name: x\nworkload: {kind: poisson}\npolicies: 5\n", "policies: must be a string (got 5)"),
    ("name: x\nworkload: {kind: poisson}\ncluster: 5\n", "cluster: must be a mapping (got 5)"),
    ("name: x\nworkload: {kind: poisson}\napps: {upload: 1, Foo: 2}\n",
     "apps: unknown app 'Foo' (known: upload, gCTF, Motioncor2)"),
    ("name: x\nworkload: {kind: poisson}\nsla_ms: {gctf: 2}\n",
     "sla_ms: unknown app 'gctf' (known: upload, gCTF, Motioncor2)"),
    ("name: x\nworkload: {kind: poisson, rat: 2}\n", "workload: unknown key 'rat' (known: kind, tasks, load, "
     "rate_per_s, trace, burst_factor, burst_fraction, mean_burst_s, clients, think_s, duration_s)"),
    ("name: x\nworkload: {kind: poisson}\nevents: [{kind: slowdown, node: cpu-1, at: 10x}]\n",
     "events[0].at: must be \"NN%\" of the run (got '10x')"),
    ("name: x\nworkload: {kind: poisson}\nevents: [{kind: slowdown, node: cpu-1, at: -1}]\n",
     "events[0].at: must be >= 0 (got -1)"),
    ("name: x\nworkload: {kind: poisson}\nevents: [{kind: neighbour, node: cpu-1, at: 1, loads: {ram: 1}}]\n",
     "events[0].loads: unknown resource 'ram' (known: gpu, membw, pcie, disk, cpu)"),
    ("name: x\nworkload: {kind: poisson, tasks: 0}\n", "workload.tasks: must be >= 1 (got 0)"),
    ("name: x\nworkload: {kind: poisson, load: 0}\n", "workload.load: must be > 0 (got 0)"),
    ("name: x\nworkload: {kind: fast}\n",
     "workload.kind: must be one of ['poisson', 'bursty', 'trace', 'closed'] (got 'fast')"),
    ("workload: {kind: poisson}\n", "name: is required"),
])
def test_a_schema_error_says_what_is_wrong(tmp_path, text, line):
    """The schema's own words named a field but not the problem ("cluster.nodes must be valid exactly by one
    definition (0 matches found)", "apps must be named by propertyName definition")."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert str(err.value) == f"{path}: {line}"


def test_a_scenario_file_that_is_not_utf8_is_named(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_bytes(b"name: \xff\n")
    assert main(["sim", "--scenario", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rttsched sim: error: {path}: 'utf-8' codec can't decode byte 0xff") and err.count("\n") == 1


@pytest.mark.parametrize("seeds", [[-1], [2, 2]])
def test_the_schema_refuses_negative_and_repeated_seeds_too(seeds):
    import fastjsonschema

    from app.sim.scenario_schema import validator

    with pytest.raises(fastjsonschema.JsonSchemaValueException, match="seeds"):
        validator()({"name": "x", "workload": {"kind": "poisson"}, "seeds": seeds})


def test_an_event_may_last_to_the_end_of_the_run():
    sc = parse_scenario({"name": "x", "workload": {"kind": "poisson", "tasks": 10, "rate_per_s": 1.0},
                         "events": [{"kind": "slowdown", "node": "cpu-1", "at": "0%", "until": "100%"}]})
    assert (sc.config.events[0].at, sc.config.events[0].until) == (0.0, 1.0)


def test_a_gpu_app_may_run_on_a_node_that_joins_when_the_rate_is_given():
    sc = parse_scenario({"name": "x", "workload": {"kind": "poisson", "rate_per_s": 1.0}, "apps": {"gCTF": 1},
                         "cluster": {"nodes": [{"class": "cpu"}]},
                         "events": [{"kind": "join", "node": "g", "at": 1,
                                     "spec": {"class": "gpu", "gpu": "RTX 4090"}}]})
    assert sc.config.mix == {"gCTF": 1}


def test_scenario_and_setup_flags_do_not_mix(capsys):
    assert main(["sim", "--scenario", str(SCENARIOS[0]), "--tasks", "10"]) == 2
    assert "--tasks" in capsys.readouterr().err


def test_scripted_join_and_leave():
    doc = {"name": "x", "workload": {"kind": "poisson", "tasks": 1500, "rate_per_s": 30.0},
           "cluster": {"nodes": [{"class": "gpu", "gpu": "Tesla M40", "name": "m40"},
                                 {"class": "cpu", "name": "cpu", "count": 2}]},
           "events": [{"kind": "join", "node": "fast", "at": "30%",
                       "spec": {"class": "gpu", "gpu": "RTX 4090", "cores": 16}},
                      {"kind": "leave", "node": "cpu-1", "at": 20}]}
    sc = parse_scenario(doc)
    m = run_offline(sc.config, "static_best", 1)
    names = m.node_names
    span = float(np.nanmax(m.submit_s))
    on_fast = m.node_idx == names.index("fast")
    assert on_fast.any() and m.start_s[on_fast].min() >= 0.3 * span - 1e-6
    assert not np.any((m.node_idx == names.index("cpu-1")) & (m.start_s > 20.0))


def test_closed_loop_clients_have_one_task_in_flight():
    doc = {"name": "x", "workload": {"kind": "closed", "clients": 5, "think_s": 0.1, "duration_s": 30}}
    m = run_offline(parse_scenario(doc).config, "kube_default", 1)
    order = np.argsort(m.submit_s)
    t = np.concatenate([m.submit_s[order], m.finish_s[order]])
    step = np.concatenate([np.ones(len(order)), -np.ones(len(order))])
    in_flight = np.cumsum(step[np.lexsort((step, t))])  # ends before starts at equal times
    assert in_flight.max() <= 5
    assert np.nanmax(m.submit_s) < 30.0
    assert m.summary()["throughput"] == pytest.approx(np.sum(m.finish_s <= 30.0) / 30.0)


@pytest.mark.parametrize("text, line", [
    ("name: x\nworkload: {kind: poisson, tasks: 20}\nseeds: [1, 2.0]\n", "seeds[1]: must be an integer (got 2.0)"),
    ("name: x\nworkload: {kind: poisson, tasks: 20}\nseeds: [1, 1.0]\n", "seeds[1]: must be an integer (got 1.0)"),
    ("name: x\nworkload: {kind: poisson, tasks: 20}\nseeds: 2.0\n",
     "seeds: must be a count of seeds (1 to it) or a list of seeds (got 2.0)"),
    ("name: x\nworkload: {kind: poisson, tasks: 20.0}\n", "workload.tasks: must be an integer (got 20.0)"),
    ("name: x\nworkload: {kind: closed, clients: 2.0, duration_s: 5}\n",
     "workload.clients: must be an integer (got 2.0)"),
    ("name: x\ncluster: {nodes: [{class: cpu, count: 2.0}, {class: gpu, gpu: RTX 4090}]}\nworkload: {kind: poisson}\n",
     "cluster.nodes[0].count: must be an integer (got 2.0)"),
    ("name: x\ncluster: {preset: large, nodes: 8.0}\nworkload: {kind: poisson}\n",
     "cluster.nodes: must be a node count (the large preset) or a list of nodes (got 8.0)"),
    ("name: x\nworkload: {kind: poisson}\nevents: [{kind: join, node: n, at: 1, spec: {class: cpu, cores: 4.0}}]\n",
     "events[0].spec.cores: must be an integer (got 4.0)"),
])
def test_a_whole_number_float_is_not_an_integer(tmp_path, text, line):
    """JSON Schema counts 2.0 as an integer; the runs do not (numpy's SeedSequence, range()): a float where a
    count or a seed goes is refused naming its field, before any run, not a TypeError after the first seed's."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert str(err.value) == f"{path}: {line}"


def test_floats_stay_numbers_where_the_schema_says_number():
    sc = parse_scenario({"name": "x", "workload": {"kind": "poisson", "tasks": 10, "load": 1, "burst_factor": 2},
                         "scrape_interval_s": 2, "seeds": [1, 2]})
    assert sc.seeds == [1, 2] and sc.config.load == 1
