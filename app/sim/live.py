"""Live mode: the simulated cluster in (accelerated) real time against the real system.

The cluster runs on a ``simpy.rt.RealtimeEnvironment``; every scrape and completion goes to Kafka through
:class:`~app.sim.kafka_sink.KafkaSink` (node-metrics, task-completions, keyed by node), and every task is
placed by the real extender over HTTP (:class:`~app.sim.policies.extender_http.ExtenderPolicy`). The worker,
trainer and extender are whatever listens on ``settings``' broker and ``extender_url`` (``rttsched demo``
starts them). :class:`~app.sim.live_watch.FeedbackWatcher` collects what the system says back, so the run's
:class:`~app.sim.results.RunMetrics` carries the extender's predictions (for accuracy figures), the
per-period errors, node weights and retrains, like an offline ``rtt_aware`` run.

Time: messages carry ``ts = start_ts + simulated seconds`` with ``start_ts`` the wall clock when the run
starts. At ``speed`` 1 (the default) simulated and wall time advance together, so the event-time windows of
the worker, the wall-clock periods of the feedback loop and the extender's staleness checks all agree.
At ``speed`` s > 1 one simulated second takes 1/s wall seconds; the caller then scales the worker's
wall-clock periods (``RTT_ERROR_PERIOD_S``, ``RTT_FEATURE_EMIT_INTERVAL_S``, ``RTT_RETRAIN_DEBOUNCE_S``,
``RTT_JOIN_PREDICTION_WAIT_S``) by 1/s (:func:`scaled_worker_env`). Message timestamps then run ahead of the wall
clock, which the extender reads as fresh data; its assumed-pod delay and TTL stay in wall seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import sys
import time
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy
import simpy.rt
from tqdm import tqdm

from app.config import Settings
from app.sim.kafka_sink import KafkaSink
from app.sim.live_watch import FeedbackWatcher
from app.sim.policies.extender_http import ExtenderPolicy
from app.sim.policy import Policy
from app.sim.results import RunMetrics
from app.sim.runner import SimConfig, Simulation, build_simulation

log = logging.getLogger(__name__)

MAX_SPEED = 20.0
BAR_COLUMNS = 100


@dataclasses.dataclass
class LiveResult:
    """A live run: its metrics (policy ``extender``) and what the sink, extender and watcher counted."""

    metrics: RunMetrics
    sink: dict[str, int]
    extender: dict[str, float]
    predictions_joined: int
    retrain_events: int
    model_updates: int
    wall_s: float
    start_ts: float
    speed: float

    def describe(self) -> dict[str, Any]:
        """Plain values for the report's config section."""
        return {"speed": self.speed, "wall_s": round(self.wall_s, 1), "start_ts": self.start_ts, "sink": self.sink,
                "extender": {k: round(v, 3) for k, v in self.extender.items()},
                "predictions_joined": self.predictions_joined, "retrain_events": self.retrain_events,
                "model_updates": self.model_updates}


def scaled_worker_env(settings: Settings, speed: float) -> dict[str, str]:
    """Environment for the worker so its wall-clock periods match ``speed`` simulated seconds per second.

    >>> scaled_worker_env(Settings(), 5.0)["RTT_ERROR_PERIOD_S"]
    '1.0'
    >>> scaled_worker_env(Settings(), 1.0)
    {}
    """
    if not 0 < speed <= MAX_SPEED:
        raise ValueError(f"speed: must be in (0, {MAX_SPEED:g}] (got {speed})")
    if speed == 1.0:
        return {}
    return {"RTT_MAX_CLOCK_SKEW_S": repr(max(settings.max_clock_skew_s, 86_400.0)),  # ts run ahead on purpose
            "RTT_ERROR_PERIOD_S": repr(settings.error_period_s / speed),
            "RTT_FEATURE_EMIT_INTERVAL_S": repr(settings.feature_emit_interval_s / speed),
            "RTT_RETRAIN_DEBOUNCE_S": repr(settings.retrain_debounce_s / speed),
            # below the TTL (not scaled) however slow the demo runs, as the worker requires
            "RTT_JOIN_PREDICTION_WAIT_S": repr(min(settings.join_prediction_wait_s / speed, settings.join_ttl_s / 2))}


def _progress(sim: Simulation, policy: ExtenderPolicy, watcher: FeedbackWatcher, bar: Any,
              on_tick: Callable[[], None] | None, tick_s: float) -> Generator[simpy.Event, Any, None]:
    cluster, env = sim.cluster, sim.env
    while cluster.running():
        yield env.timeout(tick_s)
        if on_tick is not None:
            on_tick()
        recent = policy.recent_rtt_ms
        mean = sum(recent) / len(recent) if recent else float("nan")
        bar.update(cluster.done + cluster.failed - bar.n)
        bar.set_postfix_str(f"sim {env.now:.0f}s, retrains {len(watcher.retrains)} "
                            f"(models {len(watcher.models)}), mean RTT {mean:.0f} ms", refresh=True)


def _fill_trace(metrics_policy: Policy, sim: Simulation, watcher: FeedbackWatcher, start_ts: float,
                speed: float) -> int:
    """Copy the watcher's findings into the policy's trace (times in simulated seconds); returns joins."""
    tr = metrics_policy.trace
    names = [n.name for n in sim.cluster.nodes]
    node_idx = sim.cluster.log.node_idx
    joined = 0
    for (task_id, node), pred in list(watcher.predictions.items()):
        if len(task_id) != 8 or not task_id.startswith("t") or not task_id[1:].isdigit():
            continue
        idx = int(task_id[1:])
        if idx < len(node_idx) and node_idx[idx] >= 0 and names[node_idx[idx]] == node:
            tr.predicted_ms[idx] = pred
            joined += 1

    def t(ts: float) -> float:
        return round((ts - start_ts) * speed, 3)

    tr.retrains.extend((t(ts), key, reason) for ts, key, reason in watcher.retrains)
    tr.errors.extend((t(ts), key, mape) for ts, key, mape in watcher.errors)
    tr.weights.extend((t(ts), node, w) for ts, node, w in watcher.weights)
    tr.notes["model_updates"] = [(t(ts), key, v) for ts, key, v in watcher.models]
    return joined


def run_live(config: SimConfig, settings: Settings, extender_url: str, seed: int, *, speed: float = 1.0,
             on_tick: Callable[[], None] | None = None, tick_s: float = 1.0, progress: bool = True,
             node_cache_capable: bool = True, settle_s: float = 2.0) -> LiveResult:
    """Run ``config`` with ``seed`` live: Kafka sink, extender placement, feedback watched.

    Parameters
    ----------
    config : SimConfig
        The workload; ``start_ts`` is replaced by the wall clock at the start.
    settings : Settings
        Broker and topic prefix of the system under test.
    extender_url : str
        ``urlPrefix`` of a running extender.
    speed : float
        Simulated seconds per wall second (1 = real time).
    on_tick : callable, optional
        Called every ``tick_s`` simulated seconds (e.g. ``ProcessGroup.check``); may raise to abort.
    settle_s : float
        Wall seconds to wait after the last completion for the system's last feedback messages.
    """
    if not 0 < speed <= MAX_SPEED:
        raise ValueError(f"speed: must be in (0, {MAX_SPEED:g}] (got {speed})")

    holder: list[ExtenderPolicy] = []

    def factory(rng: np.random.Generator) -> Policy:
        holder.append(ExtenderPolicy(extender_url, rng, node_cache_capable=node_cache_capable))
        return holder[0]

    watcher = FeedbackWatcher(settings).start()
    sink = KafkaSink(settings)
    bar = None
    try:
        sink.start()
        start_ts = round(time.time(), 3)
        cfg = dataclasses.replace(config, start_ts=start_ts)
        sim = build_simulation(cfg, factory, seed, sink=sink,
                               env=simpy.rt.RealtimeEnvironment(factor=1.0 / speed, strict=False))
        policy = holder[0]
        cols = min(BAR_COLUMNS, shutil.get_terminal_size((BAR_COLUMNS, 24)).columns)  # never wraps at 100 columns
        bar = tqdm(total=sim.cluster.total_tasks, file=sys.stderr, unit="task", desc="live", disable=not progress,
                   ncols=cols)
        sim.env.process(_progress(sim, policy, watcher, bar, on_tick, tick_s))
        assert isinstance(sim.env, simpy.rt.RealtimeEnvironment)
        sim.env.sync()
        t0 = time.perf_counter()
        sim.run()
        wall_s = time.perf_counter() - t0
        bar.update(len(sim.cluster.log) - bar.n)
        sink.close()
        time.sleep(settle_s)
        watcher.close()
        joined = _fill_trace(policy, sim, watcher, start_ts, speed)
        metrics = sim.metrics(wall_s=wall_s)
    finally:
        if bar is not None:
            bar.close()
        sink.close()
        watcher.close()
        for p in holder:
            p.close()
    log.info("live run: %d tasks in %.1f s wall, sink %s, extender %s", len(sim.cluster.log), wall_s,
             sink.stats(), policy.stats)
    return LiveResult(metrics, sink.stats(), dict(policy.stats), joined, len(watcher.retrains),
                      len(watcher.models), wall_s, start_ts, speed)
