"""The discrete-event cluster: arrivals (open or closed loop), scrapes, node events, joins, completions.

A task arrives; the cluster filters the nodes that can run it and have room for its requests (as
kube-scheduler's filter step: GPU apps only on GPU nodes whose GPU holds the input, requests within what
is free), the policy picks one, and the task starts with its work fixed (:meth:`NodeRuntime.work_ms`).
Its rate then changes with every start, end or event on its node (:mod:`app.sim.state`), so its finish
time moves; each node keeps one completion timer for its earliest finish, re-armed on every change. With
no candidate (or when the policy places it nowhere, as an extender's filter failing every node) the task
waits in :class:`~app.sim.pending.PendingQueue` until a completion or a joining node lets it fit.
RTT = finish - arrival (waiting included).

The same class runs in real time when given a ``simpy.rt.RealtimeEnvironment``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import simpy

from app.sim.apps import APPS
from app.sim.closed_loop import ClosedLoop
from app.sim.events import NodeEvent
from app.sim.hardware import NodeSpec
from app.sim.metrics import scrape_message
from app.sim.pending import PendingQueue
from app.sim.policy import Policy, PolicyError
from app.sim.running import Running
from app.sim.sinks import NODE_METRICS, TASK_COMPLETIONS, NullSink, Sink
from app.sim.state import EPS, NodeRuntime
from app.sim.tasklog import TaskLog
from app.sim.view import ClusterView, Task
from app.sim.workload import Workload


class Cluster:
    """One simulated cluster running one workload under one policy."""

    def __init__(self, env: simpy.Environment, nodes: Sequence[NodeSpec], workload: Workload | ClosedLoop,
                 policy: Policy, metrics_rng: np.random.Generator, *, sink: Sink | None = None,
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
        self._free = np.empty((len(self.rt), 3))  # per node (free_cpu, free_mem, gpu_room), kept by its runtime
        for k, rt in enumerate(self.rt.values()):
            rt.attach_room(self._free[k])
        self._row = {rt.name: k for k, rt in enumerate(self.rt.values())}
        self._set_active([rt for rt in self.rt.values() if rt.joined])
        self.view = ClusterView(self.rt, lambda: self.env.now, start_ts)
        self.pending = PendingQueue()
        self.log = TaskLog(len(workload) if isinstance(workload, Workload) else 4096)
        self._tasks: dict[int, Task] = {}  # running tasks by index
        self._client: dict[int, tuple[int, float]] = {}  # closed loop: task index -> (client, think s)
        self._next_idx = 0
        self._submitting = True
        self._future_joins = sum(1 for rt in self.rt.values() if not rt.joined)
        self.done = 0
        self.failed = 0
        self._closed = False
        for name in {e.node for e in events} - set(self.rt):
            raise ValueError(f"events: unknown node {name!r}")
        if isinstance(workload, ClosedLoop):
            for c, think in enumerate(workload.first_think):
                self._after(think, lambda c=c: self._client_submits(c))
        else:
            env.process(self._arrivals())
        self.scraper = env.process(self._scraper())  # ends with the run: its last scrape follows the last task
        for ev in events:
            env.process(self._event(ev))
        for rt in self.rt.values():
            if not rt.joined:
                env.process(self._join(rt))

    # -- processes
    def _after(self, delay_s: float, fn: Any) -> None:
        self.env.timeout(max(0.0, delay_s)).callbacks.append(lambda _ev: fn())

    def _arrivals(self) -> Any:
        w = self.workload
        assert isinstance(w, Workload)
        arrival, apps, sizes, z = w.arrival_s, w.apps, w.input_mb, w.noise_z
        env = self.env
        for i in range(len(w)):
            dt = float(arrival[i]) - env.now
            if dt > 0:
                yield env.timeout(dt)
            self.submit(Task(i, apps[i], float(sizes[i]), env.now, float(z[i])))
        self._submitting = False

    def _client_submits(self, client: int) -> None:
        w = self.workload
        assert isinstance(w, ClosedLoop)
        if self.env.now >= w.duration_s:
            return
        i = self._next_idx
        self._next_idx += 1
        app, mb, z, think = w.task(i)
        self._client[i] = (client, think)
        self.submit(Task(i, app, mb, self.env.now, z))

    def _client_done(self, idx: int) -> None:
        entry = self._client.pop(idx, None)
        if entry is not None:
            client, think = entry
            self._after(think, lambda: self._client_submits(client))

    @property
    def total_tasks(self) -> int | None:
        """Tasks the workload holds (open loop); None for a closed loop, which runs for a duration."""
        return len(self.workload) if isinstance(self.workload, Workload) else None

    def running(self) -> bool:
        """Whether anything can still happen: submissions, running tasks, or waiting tasks a join may place."""
        w = self.workload
        submitting = self.env.now < w.duration_s if isinstance(w, ClosedLoop) else self._submitting
        busy = any(rt.running for rt in self.rt.values())
        return submitting or busy or (len(self.pending) > 0 and self._future_joins > 0)

    def _scraper(self) -> Any:
        self.scrape_all()  # the exporters ran before the workload started: the idle cluster at t = 0
        while self.running():
            yield self.env.timeout(self.scrape_interval_s)
            self.scrape_all()

    def _event(self, ev: NodeEvent) -> Any:
        rt = self.rt[ev.node]
        yield self.env.timeout(ev.start_s)
        self._set(rt, ev, True)
        if math.isfinite(ev.end_s):
            yield self.env.timeout(ev.end_s - ev.start_s)
            self._set(rt, ev, False)

    def _set(self, rt: NodeRuntime, ev: NodeEvent, active: bool) -> None:
        now = self.env.now
        if ev.kind == "leave":
            if active and not rt.cordoned:
                rt.cordon(now)
                self._set_active([r for r in self._active if r is not rt])
            return
        rt.set_condition(now)
        rt.cond.apply(ev, active)
        rt.rerate(now)
        self._arm(rt)

    def _join(self, rt: NodeRuntime) -> Any:
        yield self.env.timeout(rt.spec.join_at_s)
        rt.join(self.env.now)
        self._future_joins -= 1
        self._set_active([r for r in self.rt.values() if r.joined and not r.cordoned])
        self._drain()

    def _set_active(self, active: list[NodeRuntime]) -> None:
        """The nodes that take tasks, in order, with their rows of the room table and their specs."""
        self._active = active
        self._active_rows = np.array([self._row[rt.name] for rt in active], dtype=np.int64)
        self._active_specs = np.empty(len(active), dtype=object)
        self._active_specs[:] = [rt.spec for rt in active]

    # -- scheduling
    def candidates(self, task: Task) -> list[NodeSpec]:
        """Nodes that pass the filter: the task's app can run there and its requests fit in what is free."""
        profile = task.profile
        p = profile.place
        cpu, mem = p.cpu_cores - EPS, p.mem_gb - EPS
        if not p.gpu_share or p.gpu_share == 1:  # every active node's room compared at once
            free = self._free[self._active_rows]
            fits = (free[:, 0] >= cpu) & (free[:, 1] >= mem)
            if p.gpu_share:  # gpu_room: the most memory free on a GPU with a share free (-1 without one)
                fits &= free[:, 2] >= profile.gpu_mem_gb(task.input_mb) - EPS
            return self._active_specs[fits].tolist()  # type: ignore[no-any-return]
        return [rt.spec for rt in self._active if profile.fits(rt.spec, task.input_mb)
                and rt.has_room(profile, task.input_mb)]

    def submit(self, task: Task) -> None:
        self.log.submitted(task.idx, task.app, task.input_mb, task.submit_s)
        cands = self.candidates(task)
        if cands:
            if not self._place(task, cands):
                self.pending.push(task)
        elif not any(task.profile.fits(rt.spec, task.input_mb) for rt in self.rt.values() if not rt.cordoned):
            self._unschedulable(task)
        else:
            self.pending.push(task)

    def _unschedulable(self, task: Task) -> None:
        self.failed += 1
        if self._emit:
            self._complete_message(task, None, "failed")
        self._client_done(task.idx)

    def _place(self, task: Task, cands: list[NodeSpec]) -> bool:
        """Start ``task`` where the policy chooses; False when it chose no node (the task waits)."""
        chosen = self.policy.choose(task, cands, self.view)
        if chosen is None:
            return False
        rt = self.rt.get(chosen.name)
        p, mb = task.profile, task.input_mb
        if rt is None or rt not in self._active or not p.fits(rt.spec, mb) or not rt.has_room(p, mb):
            raise PolicyError(f"{self.policy.name} chose {chosen.name!r}, which is not a candidate for {task}")
        now = self.env.now
        work = rt.work_ms(p, mb, task.noise_z)
        run = rt.start(task.idx, p, mb, work, now)
        rt.placed_since_scrape += 1
        self._tasks[task.idx] = task
        self.log.started(task.idx, rt.idx, now, rt.ideal_ms(p, mb) * run.start_factor, work)
        self._arm(rt)
        return True

    def _arm(self, rt: NodeRuntime) -> None:
        nxt = rt.next_finish()
        if nxt is not None:
            v = rt.version
            self._after(nxt.finish_s - self.env.now, lambda: self._fire(rt, v))

    def _fire(self, rt: NodeRuntime, version: int) -> None:
        if rt.version != version:
            return  # rates changed since this timer was armed; a newer one is pending
        run = rt.next_finish()
        if run is not None:
            self._finish(run, rt)

    def _finish(self, run: Running, rt: NodeRuntime) -> None:
        now = self.env.now
        rt.end(run, now)
        task = self._tasks.pop(run.idx)
        self.log.finished(run.idx, now, run.served_ms)
        self.done += 1
        if self._emit:
            self._complete_message(task, rt, "ok")
        self.policy.observe_completion(task, rt.name, (now - task.submit_s) * 1000.0, self.view)
        self._client_done(run.idx)
        self._drain()
        self._arm(rt)

    def _room(self, app: str) -> float:
        profile = APPS[app]
        if not profile.wants_gpu:
            return math.inf if any(rt.has_room(profile, 0.0) for rt in self._active) else -1.0
        return max((rt.free_gpu_mem(profile) for rt in self._active if rt.spec.gpu is not None), default=-1.0)

    def _drain(self) -> None:
        if not len(self.pending):
            return
        self.pending.begin()
        refused: list[Task] = []  # placed nowhere by the policy: they wait for the next drain
        while True:
            task = self.pending.pop_fitting({app: self._room(app) for app in self.pending.apps()})
            if task is None:
                break
            if not self._place(task, self.candidates(task)):
                refused.append(task)
        for task in refused:
            self.pending.push(task)

    # -- observation
    def scrape_all(self) -> None:
        ts = self.start_ts + self.env.now
        for rt in self._active:
            message = scrape_message(rt, self._rng, self.env.now, ts)
            rt.placed_since_scrape = 0
            if self._emit:
                self.sink.emit(NODE_METRICS, rt.name, message)
            self.policy.observe_metrics(rt.name, ts, message["metrics"], self.view)
        self.policy.tick(self.view)

    def _complete_message(self, task: Task, rt: NodeRuntime | None, status: str) -> None:
        now = self.env.now
        ts0 = self.start_ts
        start = self.log.cols["start_s"][task.idx]
        value: dict[str, Any] = {
            "task_id": task.task_id, "app": task.app, "node": rt.name if rt else "unschedulable",
            "submitted_ts": ts0 + task.submit_s, "started_ts": ts0 + (now if math.isnan(start) else float(start)),
            "finished_ts": ts0 + now, "rtt_ms": (now - task.submit_s) * 1000.0, "status": status,
            "input_size_mb": task.input_mb,
        }
        self.sink.emit(TASK_COMPLETIONS, value["node"], value)

    def finish(self) -> None:
        """End of run: tasks still waiting count as failed; close the integrals and the sink (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for task in self.pending.drop_all():
            self._unschedulable(task)
        for rt in self.rt.values():
            if rt.joined:
                rt.set_condition(self.env.now if rt.left_s is None else rt.left_s)
        self.sink.close()
