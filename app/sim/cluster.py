"""The discrete-event cluster: SimPy processes for arrivals, scrapes, node events and node joins.

A task arrives, the cluster filters the nodes that can run it and have room (as kube-scheduler's filter
step), the policy picks one, and the task starts at once with a service time drawn from the node's
state at that moment (:meth:`NodeRuntime.expected_ms` times log-normal noise). With no candidate the task
waits in a FIFO until a completion or a joining node frees room. RTT = finish - arrival (waiting included).

Completions are callbacks on SimPy timeouts rather than one process per task, which keeps an offline run
at tens of thousands of tasks per second of wall time. The same class runs in real time when given a
``simpy.rt.RealtimeEnvironment``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import simpy

from app.sim.apps import NOISE_SIGMA
from app.sim.events import NodeEvent
from app.sim.hardware import NodeSpec
from app.sim.metrics import scrape
from app.sim.policies.base import Policy, PolicyError
from app.sim.sinks import NODE_METRICS, TASK_COMPLETIONS, NullSink, Sink
from app.sim.state import NodeRuntime
from app.sim.view import ClusterView, Task
from app.sim.workload import Workload

PENDING_SCAN = 16  # how deep the waiting queue is scanned for a task that fits after a release


class Cluster:
    """One simulated cluster running one workload under one policy."""

    def __init__(self, env: simpy.Environment, nodes: Sequence[NodeSpec], workload: Workload, policy: Policy,
                 metrics_rng: np.random.Generator, *, sink: Sink | None = None,
                 events: Sequence[NodeEvent] = (), scrape_interval_s: float = 1.0,
                 start_ts: float = 1_700_000_000.0) -> None:
        if scrape_interval_s <= 0:
            raise ValueError(f"scrape_interval_s: must be > 0 (got {scrape_interval_s})")
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ValueError("nodes: names must be unique")
        self.env = env
        self.nodes = tuple(nodes)
        self.workload = workload
        self.policy = policy
        self.sink: Sink = sink or NullSink()
        self._emit = not isinstance(self.sink, NullSink)
        self._rng = metrics_rng
        self.scrape_interval_s = scrape_interval_s
        self.start_ts = start_ts
        self.rt: dict[str, NodeRuntime] = {n.name: NodeRuntime(n, i) for i, n in enumerate(nodes)}
        self._joined = [rt for rt in self.rt.values() if rt.joined]
        self.view = ClusterView(self.rt, lambda: self.env.now, start_ts)
        self._pending: deque[Task] = deque()
        n = len(workload)
        self.node_idx = np.full(n, -1, dtype=np.int32)
        self.start_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.expected_ms = np.full(n, np.nan)
        self.done = 0
        self.failed = 0
        self._closed = False
        for name in {e.node for e in events} - set(self.rt):
            raise ValueError(f"events: unknown node {name!r}")
        env.process(self._arrivals())
        env.process(self._scraper())
        for ev in events:
            env.process(self._event(ev))
        for rt in self.rt.values():
            if not rt.joined:
                env.process(self._join(rt))

    # -- processes
    def _arrivals(self) -> Any:
        w = self.workload
        arrival, apps, sizes, z = w.arrival_s, w.apps, w.input_mb, w.noise_z
        env = self.env
        for i in range(len(w)):
            dt = float(arrival[i]) - env.now
            if dt > 0:
                yield env.timeout(dt)
            self.submit(Task(i, apps[i], float(sizes[i]), env.now, float(z[i])))

    def _scraper(self) -> Any:
        env = self.env
        while self.done + self.failed < len(self.workload):
            yield env.timeout(self.scrape_interval_s)
            self.scrape_all()

    def _event(self, ev: NodeEvent) -> Any:
        rt = self.rt[ev.node]
        yield self.env.timeout(ev.start_s)
        rt.set_condition(self.env.now)
        rt.cond.apply(ev, True)
        if math.isfinite(ev.end_s):
            yield self.env.timeout(ev.end_s - ev.start_s)
            rt.set_condition(self.env.now)
            rt.cond.apply(ev, False)

    def _join(self, rt: NodeRuntime) -> Any:
        yield self.env.timeout(rt.spec.join_at_s)
        rt.join(self.env.now)
        self._joined = [r for r in self.rt.values() if r.joined]
        self._drain()

    # -- scheduling
    def candidates(self, task: Task) -> list[NodeSpec]:
        p, mb = task.profile, task.input_mb
        return [rt.spec for rt in self._joined if p.fits(rt.spec, mb) and rt.has_room(p, mb)]

    def submit(self, task: Task) -> None:
        cands = self.candidates(task)
        if cands:
            self._place(task, cands)
        elif not any(task.profile.fits(rt.spec, task.input_mb) for rt in self.rt.values()):
            self.failed += 1
            self._complete_message(task, None, "failed")
        else:
            self._pending.append(task)

    def _place(self, task: Task, cands: list[NodeSpec]) -> None:
        chosen = self.policy.choose(task, cands, self.view)
        rt = self.rt.get(chosen.name)
        p, mb = task.profile, task.input_mb
        if rt is None or not rt.joined or not p.fits(rt.spec, mb) or not rt.has_room(p, mb):
            raise PolicyError(f"{self.policy.name} chose {chosen.name!r}, which is not a candidate for {task}")
        now = self.env.now
        expected = rt.expected_ms(p, mb)
        sigma = NOISE_SIGMA[rt.spec.node_class]
        service_ms = expected * math.exp(sigma * task.noise_z - 0.5 * sigma * sigma)
        rt.allocate(p, mb, now)
        rt.placed_since_scrape += 1
        i = task.idx
        self.node_idx[i] = rt.idx
        self.start_s[i] = now
        self.expected_ms[i] = expected
        self.env.timeout(service_ms / 1000.0).callbacks.append(lambda _ev: self._finish(task, rt))

    def _finish(self, task: Task, rt: NodeRuntime) -> None:
        now = self.env.now
        rt.release(task.profile, task.input_mb, now)
        self.finish_s[task.idx] = now
        self.done += 1
        rtt_ms = (now - task.submit_s) * 1000.0
        if self._emit:
            self._complete_message(task, rt, "ok")
        self.policy.observe_completion(task, rt.name, rtt_ms, self.view)
        if self._pending:
            self._drain()

    def _drain(self) -> None:
        scanned = 0
        keep: list[Task] = []
        while self._pending and scanned < PENDING_SCAN:
            task = self._pending.popleft()
            scanned += 1
            cands = self.candidates(task)
            if cands:
                self._place(task, cands)
            else:
                keep.append(task)
        self._pending.extendleft(reversed(keep))

    # -- observation
    def scrape_all(self) -> None:
        ts = self.start_ts + self.env.now
        for rt in self._joined:
            metrics = scrape(rt, self._rng, self.env.now)
            rt.placed_since_scrape = 0
            self.view.record_scrape(rt.name, metrics)
            if self._emit:
                self.sink.emit(NODE_METRICS, rt.name, {
                    "node": rt.name, "ts": ts, "node_class": rt.spec.node_class,
                    "gpu_model": rt.spec.gpu_model, "metrics": metrics,
                })
            self.policy.observe_metrics(rt.name, ts, metrics, self.view)
        self.policy.tick(self.view)

    def _complete_message(self, task: Task, rt: NodeRuntime | None, status: str) -> None:
        now = self.env.now
        ts0 = self.start_ts
        start = self.start_s[task.idx]
        value: dict[str, Any] = {
            "task_id": task.task_id, "app": task.app, "node": rt.name if rt else "unschedulable",
            "submitted_ts": ts0 + task.submit_s, "started_ts": ts0 + (now if math.isnan(start) else float(start)),
            "finished_ts": ts0 + now, "rtt_ms": (now - task.submit_s) * 1000.0, "status": status,
            "input_size_mb": task.input_mb,
        }
        self.sink.emit(TASK_COMPLETIONS, value["node"], value)

    def finish(self) -> None:
        """Close the utilisation integrals at the current time and the sink (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for rt in self.rt.values():
            if rt.joined:
                rt.set_condition(self.env.now)
        self.sink.close()

