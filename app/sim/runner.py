"""Offline runs: one config, one policy, one seed -> :class:`RunMetrics`, reproducible bit for bit.

Random streams are spawned from the seed, one per concern (workload, exporter noise, policy), so every
policy of a seed sees the same tasks, the same noise draws and the same scrape noise.

>>> m = run_offline(SimConfig(n_tasks=300), "round_robin", seed=3)
>>> m2 = run_offline(SimConfig(n_tasks=300), "round_robin", seed=3)
>>> m.fingerprint() == m2.fingerprint(), int(m.summary()["tasks"])
(True, 300)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import simpy

from app.config import positive
from app.sim.capacity import capacity_per_s
from app.sim.closed_loop import ClosedLoop
from app.sim.cluster import Cluster
from app.sim.events import EventSpec, NodeEvent, default_events, resolve
from app.sim.hardware import NodeSpec, gpu_node, preset
from app.sim.policies import Policy, make_policy
from app.sim.results import DEFAULT_SLA_MS, RunMetrics
from app.sim.sinks import Sink
from app.sim.workload import Workload, bursty_workload, poisson_workload, trace_workload

RATE_PER_NODE_S = 4.0  # default arrival rate per node of the preset (moderate load)
ARRIVALS = ("poisson", "bursty", "trace", "closed")


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """A run's setup. Nodes: ``nodes`` if given, else the preset. Open loop (``arrivals`` poisson, bursty,
    trace): ``n_tasks`` at ``rate_per_s``, or ``load`` x the cluster's capacity
    (:func:`app.sim.capacity.capacity_per_s`), or ``RATE_PER_NODE_S`` per node. Closed loop (``closed``):
    ``clients`` with mean think time ``think_s`` submitting for ``duration_s``. ``events``: ``default``
    (throttle, noisy neighbour, slowdown), ``none``, or scripted :class:`EventSpec` s; ``join_node`` adds an
    M40 24GB node half-way (only with ``default``)."""

    preset: str = "small"
    n_nodes: int | None = None  # large preset only
    nodes: tuple[NodeSpec, ...] = ()
    n_tasks: int = 5000
    rate_per_s: float | None = None
    load: float | None = None
    arrivals: str = "poisson"
    trace_path: str | None = None
    burst_factor: float = 4.0
    burst_fraction: float = 0.2
    mean_burst_s: float = 5.0
    clients: int = 0
    think_s: float = 0.0
    duration_s: float = 0.0
    mix: Mapping[str, float] | None = None
    events: str | tuple[EventSpec, ...] = "default"
    join_node: bool = True
    scrape_interval_s: float = 1.0
    start_ts: float = 1_700_000_000.0
    sla_ms: Mapping[str, float] = dataclasses.field(default_factory=lambda: dict(DEFAULT_SLA_MS))

    def __post_init__(self) -> None:
        if self.arrivals not in ARRIVALS:
            raise ValueError(f"SimConfig.arrivals: must be one of {', '.join(ARRIVALS)} (got {self.arrivals!r})")
        if self.arrivals == "trace" and not self.trace_path:
            raise ValueError("SimConfig.trace_path: required when arrivals is 'trace'")
        if self.arrivals == "closed" and (self.clients < 1 or self.duration_s <= 0):
            raise ValueError("SimConfig.clients, duration_s: a closed loop needs clients >= 1 and duration_s > 0")
        if isinstance(self.events, str) and self.events not in ("default", "none"):
            raise ValueError(f"SimConfig.events: must be default, none or a list of events (got {self.events!r})")
        if self.n_tasks <= 0:
            raise ValueError(f"SimConfig.n_tasks: must be > 0 (got {self.n_tasks})")
        for name in ("rate_per_s", "load"):
            v = getattr(self, name)
            problem = None if v is None else positive(v)  # the settings' own check: > 0 and finite
            if problem:
                raise ValueError(f"SimConfig.{name}: {problem}")

    def base_nodes(self) -> list[NodeSpec]:
        return list(self.nodes) if self.nodes else preset(self.preset, self.n_nodes)


def _streams(seed: int) -> dict[str, np.random.Generator]:
    names = ("workload", "metrics", "policy")
    return {n: np.random.default_rng(s) for n, s in zip(names, np.random.SeedSequence(seed).spawn(len(names)),
                                                         strict=True)}


def build_nodes(config: SimConfig, duration_s: float) -> list[NodeSpec]:
    """The base nodes plus the default joining node (scripted joins come from :func:`build_events`)."""
    nodes = config.base_nodes()
    if config.join_node and config.events == "default":
        nodes.append(gpu_node("worker-join", "Tesla M40 24GB", cores=12, disk_mb_s=450.0,
                              join_at_s=round(0.5 * duration_s, 3)))
    return nodes


def build_events(config: SimConfig, nodes: list[NodeSpec], span_s: float) -> tuple[list[NodeSpec], list[NodeEvent]]:
    """(all nodes, node events) for a run of ``span_s`` seconds."""
    if config.events == "default":
        return nodes, default_events(nodes, span_s)
    if config.events == "none":
        return nodes, []
    assert not isinstance(config.events, str)
    joins, events = resolve(config.events, nodes, span_s)
    return nodes + joins, events


def offered_rate(config: SimConfig) -> float:
    """The open-loop arrival rate (tasks/s) of ``config``."""
    if config.rate_per_s:
        return config.rate_per_s
    base = config.base_nodes()
    if config.load:
        return config.load * capacity_per_s(base, config.mix)
    return RATE_PER_NODE_S * len(base)


def build_workload(config: SimConfig, rng: np.random.Generator) -> Workload | ClosedLoop:
    if config.arrivals == "closed":
        return ClosedLoop(rng, config.clients, config.think_s, config.duration_s, config.mix)
    if config.arrivals == "trace":
        return trace_workload(config.trace_path or "", rng, limit=config.n_tasks)
    rate = offered_rate(config)
    if config.arrivals == "bursty":
        return bursty_workload(rng, config.n_tasks, rate, config.mix, burst_factor=config.burst_factor,
                               burst_fraction=config.burst_fraction, mean_burst_s=config.mean_burst_s)
    return poisson_workload(rng, config.n_tasks, rate, config.mix)


@dataclasses.dataclass
class Simulation:
    """A built, not yet run, simulation; live mode drives :attr:`env` itself (e.g. in real time)."""

    config: SimConfig
    seed: int
    env: simpy.Environment
    cluster: Cluster
    policy: Policy
    events: list[NodeEvent]

    def run(self, until: float | None = None) -> None:
        """Run to ``until`` (seconds), or to the run's end: the scrape that follows its last task (the cluster's
        scraper stops there). Node events scripted past it would change nothing but stretch the measured span
        (makespan, and the time gpu_util and load_diff divide by)."""
        self.env.run(until=self.cluster.scraper if until is None else until)

    def metrics(self, wall_s: float = 0.0) -> RunMetrics:
        c = self.cluster
        c.finish()
        end = float(self.env.now)
        n = len(c.nodes)
        gpu_busy, util, demand = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
        for i, node in enumerate(c.nodes):
            rt = c.rt[node.name]
            stop = end if rt.left_s is None else max(rt.left_s, rt.last_t)
            span = stop - node.join_at_s
            if not rt.joined or span <= 0:
                continue
            if node.gpu_count:
                gpu_busy[i] = util[i] = rt.gpu_busy_area / node.gpu_count / span
                demand[i] = rt.gpu_demand_area / span
            else:
                util[i] = rt.busy_area / span
        cols = c.log.arrays()
        pred = np.full(len(c.log), np.nan)
        for idx, p in self.policy.trace.predicted_ms.items():
            if idx < len(pred):
                pred[idx] = p
        w = c.workload
        return RunMetrics(
            policy=self.policy.name, seed=self.seed, node_names=tuple(x.name for x in c.nodes),
            node_classes=tuple(x.node_class for x in c.nodes), apps=tuple(c.log.apps), input_mb=cols["input_mb"],
            submit_s=cols["submit_s"], start_s=cols["start_s"], finish_s=cols["finish_s"],
            node_idx=cols["node_idx"], expected_ms=cols["expected_ms"], predicted_ms=pred, node_gpu_util=gpu_busy,
            node_util=util, makespan_s=end, wall_s=wall_s, failed=c.failed, trace=self.policy.trace,
            sla_ms=dict(self.config.sla_ms), work_ms=cols["work_ms"], served_ms=cols["served_ms"],
            node_gpu_demand=demand, window_s=w.duration_s if isinstance(w, ClosedLoop) else None,
            events=tuple(self.events),
        )


def build_simulation(config: SimConfig, policy: str | Callable[[np.random.Generator], Policy], seed: int, *,
                     sink: Sink | None = None, env: simpy.Environment | None = None) -> Simulation:
    """Everything of a run, wired: nodes, workload, events, policy, cluster on ``env`` (default: a fresh one)."""
    rngs = _streams(seed)
    workload = build_workload(config, rngs["workload"])
    nodes, events = build_events(config, build_nodes(config, workload.duration_s), workload.duration_s)
    pol = make_policy(policy, rngs["policy"]) if isinstance(policy, str) else policy(rngs["policy"])
    env = env or simpy.Environment()
    cluster = Cluster(env, nodes, workload, pol, rngs["metrics"], sink=sink, events=events,
                      scrape_interval_s=config.scrape_interval_s, start_ts=config.start_ts)
    return Simulation(config, seed, env, cluster, pol, events)


def run_offline(config: SimConfig, policy: str | Callable[[np.random.Generator], Policy], seed: int, *,
                sink: Sink | None = None) -> RunMetrics:
    """Run ``policy`` (a name or a factory taking the policy's generator) on ``config`` with ``seed``."""
    sim = build_simulation(config, policy, seed, sink=sink)
    t0 = time.perf_counter()
    sim.run()
    return sim.metrics(wall_s=time.perf_counter() - t0)


def describe(config: SimConfig) -> dict[str, Any]:
    """The config as plain JSON-able values (for reports)."""
    d = dataclasses.asdict(config)
    d["sla_ms"] = dict(config.sla_ms)
    d["mix"] = dict(config.mix) if config.mix else None
    d["nodes"] = [n.name for n in config.nodes]
    if not isinstance(config.events, str):
        d["events"] = [{"kind": e.kind, "node": e.node, "at": e.at, "until": e.until, "relative": e.relative,
                        "factor": e.factor, "loads": dict(e.loads)} for e in config.events]
    return d
