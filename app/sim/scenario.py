"""Scenario files: a cluster, an app mix, a workload, scripted events and seeds, in YAML.

The schema is ``app/sim/scenario.schema.json`` (docs/simulator.md shows it by example); a file is checked
against it and then for what a schema cannot say (a node an event names exists, a GPU model is known,
``at`` and ``until`` in the same unit). Any problem raises :class:`ScenarioError`: one line naming the
file and the field.

>>> s = parse_scenario({"name": "x", "workload": {"kind": "poisson", "tasks": 100, "load": 0.5},
...                     "events": [{"kind": "slowdown", "node": "@fastest-gpu", "at": "40%", "factor": 3}]})
>>> s.config.arrivals, s.config.load, s.seeds, s.config.events[0].relative
('poisson', 0.5, [1, 2, 3, 4, 5], True)
>>> parse_scenario({"name": "x", "workload": {"kind": "closed"}}, "bad.yaml")
Traceback (most recent call last):
...
app.sim.scenario.ScenarioError: bad.yaml: workload.clients: a closed loop needs clients and duration_s
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from app.errors import ConfigError, read_error
from app.sim.capacity import unrunnable
from app.sim.events import SELECTORS, EventSpec
from app.sim.hardware import NodeSpec, cpu_node, gpu_node, preset
from app.sim.policies import PolicyError, parse_policies
from app.sim.runner import SimConfig
from app.sim.scenario_schema import schema_problem
from app.sim.workload import DEFAULT_MIX, check_mix

DEFAULT_SEEDS = 5
MAX_SEED = 2**63  # seeds are below it
MAX_SEEDS = 10_000  # seeds a file may run: each runs every policy once; 2**63 - 1 of them ended in MemoryError


class ScenarioError(ConfigError):
    """A scenario file is unreadable or invalid; the message names the file and the field."""

    def __init__(self, where: str, field: str, message: str) -> None:
        super().__init__(f"{where}: {field}" if field else where, message)


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    config: SimConfig
    seeds: list[int]
    policies: str | None = None  # "all" or a comma-separated list; None: the caller's choice


def _node(d: Mapping[str, Any], name: str, field: str, where: str) -> NodeSpec:
    try:
        if d["class"] == "gpu":
            if "gpu" not in d:
                raise ValueError("a gpu node needs its GPU model (gpu)")
            spec = gpu_node(name, d["gpu"], count=d.get("gpus", 1), cores=d.get("cores", 16),
                            mem_gb=d.get("mem_gb", 64.0), disk_mb_s=d.get("disk_mb_s", 500.0))
            return dataclasses.replace(spec, gpu_slots=d.get("slots", spec.gpu_slots))
        if "gpu" in d or "gpus" in d or "slots" in d:
            raise ValueError("a cpu node has no gpu, gpus or slots")
        return cpu_node(name, cores=d.get("cores", 32), mem_gb=d.get("mem_gb", 128.0),
                        disk_mb_s=d.get("disk_mb_s", 400.0))
    except ValueError as exc:
        raise ScenarioError(where, field, str(exc)) from None


def _nodes(cluster: Mapping[str, Any], where: str) -> tuple[str, int | None, tuple[NodeSpec, ...]]:
    name = cluster.get("preset", "small")
    nodes = cluster.get("nodes")
    if isinstance(nodes, int):
        if name != "large":
            raise ScenarioError(where, "cluster.nodes", "a node count applies to the large preset only")
        return name, nodes, ()
    if nodes is None:
        return name, None, ()
    out: list[NodeSpec] = []
    for i, d in enumerate(nodes):
        for j in range(d.get("count", 1)):
            base = d.get("name", f"{d['class']}-{i + 1}")
            out.append(_node(d, base if d.get("count", 1) == 1 else f"{base}-{j + 1}", f"cluster.nodes[{i}]",
                             where))
    if len({n.name for n in out}) != len(out):
        raise ScenarioError(where, "cluster.nodes", "node names must be unique")
    return name, None, tuple(out)


def _time(v: float | str, where: str, field: str) -> tuple[float, bool]:
    """(seconds, False) or (fraction of the run, True) from ``12.5`` or ``"40%"``; a share over 100 % is an
    error (it would fall after the run's end and stretch the run, and its utilisation figures, to it)."""
    if not isinstance(v, str):
        return float(v), False
    share = float(v[:-1]) / 100.0
    if share > 1.0:
        raise ScenarioError(where, field, f"must be at most 100% of the run (got {v})")
    return share, True


def _events(raw: list[Mapping[str, Any]], names: set[str], where: str) -> tuple[EventSpec, ...]:
    out = []
    for i, e in enumerate(raw):
        field = f"events[{i}]"
        at, rel = _time(e["at"], where, f"{field}.at")
        until, rel_until = _time(e["until"], where, f"{field}.until") if "until" in e else (float("inf"), rel)
        if rel_until != rel:
            raise ScenarioError(where, f"{field}.until", "use the same unit as at (seconds or %)")
        if until <= at:
            raise ScenarioError(where, f"{field}.until", "must be later than at")
        spec = None
        if e["kind"] == "join":
            if "spec" not in e:
                raise ScenarioError(where, f"{field}.spec", "a join needs the joining node's description")
            if e["node"] in names:
                raise ScenarioError(where, f"{field}.node", f"{e['node']!r} is already a node")
            spec = _node(e["spec"], e["node"], f"{field}.spec", where)
            names.add(e["node"])
        elif e["node"] not in names and e["node"] not in SELECTORS:
            raise ScenarioError(where, f"{field}.node", f"unknown node {e['node']!r} (a node name or one of "
                                f"{', '.join(SELECTORS)})")
        if e["kind"] == "neighbour" and not e.get("loads"):
            raise ScenarioError(where, f"{field}.loads", "a neighbour needs the loads it adds")
        out.append(EventSpec(e["kind"], e["node"], at, until, rel, float(e.get("factor", 1.0)),
                             dict(e.get("loads", {})), spec))
    return tuple(out)


def _finite(doc: Any, where: str, path: str = "") -> None:
    """Every number of ``doc`` finite: YAML's ``.inf`` and ``.nan`` pass a schema's bounds (``.inf`` as a
    factor or a duration never ends a run); the first that is not is an error naming its key path."""
    if isinstance(doc, float) and not math.isfinite(doc):
        raise ScenarioError(where, path, f"must be a finite number (got {doc})")
    if isinstance(doc, dict):
        for key, value in doc.items():
            _finite(value, where, f"{path}.{key}" if path else str(key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            _finite(value, where, f"{path}[{i}]")


def _seeds(doc: Any, where: str) -> None:
    """Seeds are numpy seeds: >= 0, below 2**63 (the report's JSON holds 64-bit integers), each once (the
    schema's own message for a list would not say which one; a repeated seed would count as one more seed
    with the same figures, narrowing the interval for nothing). A count runs seeds 1 to it, at most
    :data:`MAX_SEEDS` of them."""
    seeds = doc.get("seeds") if isinstance(doc, dict) else None
    if isinstance(seeds, int) and not isinstance(seeds, bool) and seeds > MAX_SEEDS:
        raise ScenarioError(where, "seeds", f"must be <= {MAX_SEEDS} (got {seeds})")
    listed: list[Any] = seeds if isinstance(seeds, list) else []
    if len(listed) > MAX_SEEDS:
        raise ScenarioError(where, "seeds", f"must list at most {MAX_SEEDS} seeds (got {len(listed)})")
    for i, seed in enumerate(listed):
        if isinstance(seed, float):  # before the schema's "unique items", which would not say which
            raise ScenarioError(where, f"seeds[{i}]", f"must be an integer (got {seed!r})")
        if not isinstance(seed, int) or isinstance(seed, bool):
            continue  # the schema's to refuse
        if seed < 0:
            raise ScenarioError(where, f"seeds[{i}]", f"must be >= 0 (got {seed})")
        if seed >= MAX_SEED:
            raise ScenarioError(where, f"seeds[{i}]", f"must be below 2**63 (got {seed})")
        if seed in listed[:i]:
            raise ScenarioError(where, f"seeds[{i}]", f"{seed} is given twice (each seed runs once)")


def check_trace(config: SimConfig, field: str, where: str = "") -> None:
    """Read ``config``'s trace as a run will (its first ``n_tasks`` rows), so that a missing or bad file fails
    at setup naming ``field`` (a flag, or a scenario file's ``workload.trace`` with ``where``), not in the
    first run."""
    import numpy as np

    from app.sim.workload import TraceError, trace_workload

    try:
        trace_workload(config.trace_path or "", np.random.default_rng(0), limit=config.n_tasks)
    except TraceError as exc:
        raise (ScenarioError(where, field, str(exc)) if where else ConfigError(field, str(exc))) from None


def _mix(mix: Mapping[str, float] | None, nodes: list[NodeSpec], where: str, at: str = "") -> None:
    """The app mix: weights not all 0, every app in it one a node can run (``at``: which nodes, in words)."""
    try:
        check_mix(mix or DEFAULT_MIX)
    except ValueError as exc:
        raise ScenarioError(where, "apps", str(exc).removeprefix("workload.mix: ")) from None
    for app in unrunnable(nodes, mix or DEFAULT_MIX):
        given = "" if mix else " (it is in the default mix: give apps)"
        raise ScenarioError(where, "apps", f"no node{at} can run {app!r}{given}")


def parse_scenario(doc: Any, where: str = "<scenario>", base_dir: Path | None = None) -> Scenario:
    """A validated :class:`Scenario` from a parsed YAML document."""
    _finite(doc, where)
    _seeds(doc, where)
    problem = schema_problem(doc)
    if problem:
        raise ScenarioError(where, *problem)
    preset_name, n_nodes, explicit = _nodes(doc.get("cluster", {}), where)
    at_start = list(explicit or preset(preset_name, n_nodes))
    names = {n.name for n in at_start}
    w = doc["workload"]
    kind = w["kind"]
    if kind == "closed" and not ("clients" in w and "duration_s" in w):
        raise ScenarioError(where, "workload.clients", "a closed loop needs clients and duration_s")
    if kind != "closed" and {"clients", "think_s", "duration_s"} & set(w):
        raise ScenarioError(where, "workload.clients", "clients, think_s and duration_s are for a closed loop")
    if "load" in w and "rate_per_s" in w:
        raise ScenarioError(where, "workload.load", "give load or rate_per_s, not both")
    if kind == "trace" and "trace" not in w:
        raise ScenarioError(where, "workload.trace", "a trace workload needs the trace file")
    trace = str((base_dir or Path(".")) / w["trace"]) if "trace" in w else None
    seeds = doc.get("seeds", DEFAULT_SEEDS)
    extra: dict[str, Any] = {"sla_ms": dict(doc["sla_ms"])} if "sla_ms" in doc else {}
    events = _events(doc.get("events", []), names, where)
    mix = dict(doc["apps"]) if "apps" in doc else None
    if kind != "trace":  # a trace names its apps itself
        if "load" in w:  # a multiple of the capacity of the nodes there at the start
            _mix(mix, at_start, where, " present at the start (load is a multiple of their capacity)")
        else:
            _mix(mix, at_start + [e.spec for e in events if e.spec is not None], where)
    try:
        config = SimConfig(
            preset=preset_name, n_nodes=n_nodes, nodes=explicit, n_tasks=w.get("tasks", 5000),
            rate_per_s=w.get("rate_per_s"), load=w.get("load"), arrivals=kind, trace_path=trace,
            burst_factor=w.get("burst_factor", 4.0), burst_fraction=w.get("burst_fraction", 0.2),
            mean_burst_s=w.get("mean_burst_s", 5.0), clients=w.get("clients", 0), think_s=w.get("think_s", 0.0),
            duration_s=w.get("duration_s", 0.0), mix=mix,
            events=events, join_node=False,
            scrape_interval_s=doc.get("scrape_interval_s", 1.0), **extra)
    except ValueError as exc:
        raise ScenarioError(where, "", str(exc)) from None
    if kind == "trace":
        check_trace(config, "workload.trace", where)
    policies = doc.get("policies")
    if policies is not None:
        try:
            parse_policies(policies)
        except PolicyError as exc:
            raise ScenarioError(where, "policies", str(exc)) from None
    return Scenario(doc["name"], doc.get("description", "").strip(), config,
                    list(range(1, seeds + 1)) if isinstance(seeds, int) else list(seeds), policies)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file (YAML)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(str(p), "", read_error(exc)) from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(str(p), "", read_error(exc)) from None
    return parse_scenario(doc, str(p), p.parent)
