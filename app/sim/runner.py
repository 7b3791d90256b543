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

from app.sim.cluster import Cluster
from app.sim.events import NodeEvent, default_events
from app.sim.hardware import NodeSpec, gpu_node, preset
from app.sim.policies import Policy, make_policy
from app.sim.results import DEFAULT_SLA_MS, RunMetrics
from app.sim.sinks import Sink
from app.sim.workload import Workload, bursty_workload, poisson_workload, trace_workload

RATE_PER_NODE_S = 4.0  # default arrival rate per node of the preset (moderate load)


@dataclasses.dataclass(frozen=True)
class SimConfig:
    preset: str = "small"
    n_nodes: int | None = None  # large preset only
    n_tasks: int = 5000
    rate_per_s: float | None = None  # None: RATE_PER_NODE_S x nodes
    arrivals: str = "poisson"  # poisson | bursty | trace
    trace_path: str | None = None
    mix: Mapping[str, float] | None = None
    events: str = "default"  # default | none
    join_node: bool = True  # a GPU node joins halfway through
    scrape_interval_s: float = 1.0
    start_ts: float = 1_700_000_000.0
    sla_ms: Mapping[str, float] = dataclasses.field(default_factory=lambda: dict(DEFAULT_SLA_MS))

    def __post_init__(self) -> None:
        if self.arrivals not in ("poisson", "bursty", "trace"):
            raise ValueError(f"SimConfig.arrivals: must be poisson, bursty or trace (got {self.arrivals!r})")
        if self.arrivals == "trace" and not self.trace_path:
            raise ValueError("SimConfig.trace_path: required when arrivals is 'trace'")
        if self.events not in ("default", "none"):
            raise ValueError(f"SimConfig.events: must be default or none (got {self.events!r})")
        if self.n_tasks <= 0:
            raise ValueError(f"SimConfig.n_tasks: must be > 0 (got {self.n_tasks})")
        if self.rate_per_s is not None and self.rate_per_s <= 0:
            raise ValueError(f"SimConfig.rate_per_s: must be > 0 (got {self.rate_per_s})")


def _streams(seed: int) -> dict[str, np.random.Generator]:
    names = ("workload", "metrics", "policy")
    return {n: np.random.default_rng(s) for n, s in zip(names, np.random.SeedSequence(seed).spawn(len(names)),
                                                         strict=True)}


def build_nodes(config: SimConfig, duration_s: float) -> list[NodeSpec]:
    nodes = preset(config.preset, config.n_nodes)
    if config.join_node:
        nodes.append(gpu_node("worker-join", "Tesla M40 24GB", cores=12, disk_mb_s=450.0,
                              join_at_s=round(0.5 * duration_s, 3)))
    return nodes


def build_workload(config: SimConfig, rng: np.random.Generator) -> Workload:
    n_base = len(preset(config.preset, config.n_nodes))
    rate = config.rate_per_s or RATE_PER_NODE_S * n_base
    if config.arrivals == "trace":
        return trace_workload(config.trace_path or "", rng, limit=config.n_tasks)
    if config.arrivals == "bursty":
        return bursty_workload(rng, config.n_tasks, rate, config.mix)
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
        self.env.run(until=until)

    def metrics(self, wall_s: float = 0.0) -> RunMetrics:
        c = self.cluster
        c.finish()
        w = c.workload
        end = float(self.env.now)
        gpu_util = np.full(len(c.nodes), np.nan)
        util = np.full(len(c.nodes), np.nan)
        for i, n in enumerate(c.nodes):
            rt = c.rt[n.name]
            span = end - n.join_at_s
            if not rt.joined or span <= 0:
                continue
            g, u = rt.gpu_area / span, rt.cpu_area / span
            if n.node_class == "gpu":
                gpu_util[i] = g
                util[i] = g
            else:
                util[i] = u
        pred = np.full(len(w), np.nan)
        for idx, p in self.policy.trace.predicted_ms.items():
            pred[idx] = p
        return RunMetrics(
            policy=self.policy.name, seed=self.seed, node_names=tuple(n.name for n in c.nodes),
            node_classes=tuple(n.node_class for n in c.nodes), apps=w.apps, input_mb=w.input_mb,
            submit_s=w.arrival_s, start_s=c.start_s, finish_s=c.finish_s, node_idx=c.node_idx,
            expected_ms=c.expected_ms, predicted_ms=pred, node_gpu_util=gpu_util, node_util=util,
            makespan_s=end, wall_s=wall_s, failed=c.failed, trace=self.policy.trace, sla_ms=dict(self.config.sla_ms),
        )


def build_simulation(config: SimConfig, policy: str | Callable[[np.random.Generator], Policy], seed: int, *,
                     sink: Sink | None = None, env: simpy.Environment | None = None) -> Simulation:
    """Everything of a run, wired: nodes, workload, events, policy, cluster on ``env`` (default: a fresh one)."""
    rngs = _streams(seed)
    workload = build_workload(config, rngs["workload"])
    nodes = build_nodes(config, workload.duration_s)
    events = default_events(nodes, workload.duration_s) if config.events == "default" else []
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
    return d
