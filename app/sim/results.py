"""What one offline run returns: per-task arrays, per-node utilisation, the policy's trace, and the figures.

Figures (:meth:`RunMetrics.summary`; docs/simulator.md defines each):

- ``mean_rtt_ms``, ``p95_rtt_ms``, ``p99_rtt_ms``, ``rtt_std_ms`` (completion-time standard deviation), over
  completed tasks; RTT = finish - arrival
- ``queue_ms``, ``queue_p99_ms``: time from arrival to start (pending included)
- ``throughput``: completed tasks per second - over the run for an open loop (first arrival to last finish),
  over the submission window for a closed loop (tasks finished within it)
- ``gpu_util``: fraction of time each GPU runs at least one task, averaged over a node's GPUs and then over
  GPU nodes; ``gpu_demand`` beside it: the time-averaged compute demand of tasks (0..1)
- ``load_diff``: max - min over nodes of each node's utilisation (GPU nodes: ``gpu_util``; CPU nodes:
  fraction of time it runs at least one task), in percentage points; ``load_std`` their standard deviation
- ``sla``: fraction of completed tasks whose RTT met their app's SLA
- ``acc:<app>:<class>``: prediction accuracy ``1 - MAPE`` after warm-up, where the policy predicts
- ``retrains``: model retrains the policy triggered; ``tasks_per_wall_s``: simulator speed
- ``makespan_s``: start to end of the run, the scrape after its last task (node events scripted past it
  do not run: they stretch neither it nor the span ``gpu_util`` and ``load_diff`` divide by)
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping

import numpy as np

from app.sim.events import NodeEvent
from app.sim.policy import PolicyTrace

DEFAULT_SLA_MS: dict[str, float] = {"upload": 250.0, "gCTF": 200.0, "Motioncor2": 500.0}
WARMUP_FRACTION = 0.2  # tasks excluded from accuracy figures while models learn


@dataclasses.dataclass
class RunMetrics:
    policy: str
    seed: int
    node_names: tuple[str, ...]
    node_classes: tuple[str, ...]
    apps: tuple[str, ...]
    input_mb: np.ndarray
    submit_s: np.ndarray
    start_s: np.ndarray
    finish_s: np.ndarray
    node_idx: np.ndarray
    expected_ms: np.ndarray  # service time expected at start (no noise, nothing changing)
    predicted_ms: np.ndarray
    node_gpu_util: np.ndarray  # fraction of time a GPU runs >= 1 task (mean over the node's GPUs); NaN on CPU
    node_util: np.ndarray  # per node: gpu busy on GPU nodes, >= 1 task on CPU nodes; NaN before joining
    makespan_s: float
    wall_s: float
    failed: int
    trace: PolicyTrace
    sla_ms: Mapping[str, float] = dataclasses.field(default_factory=lambda: dict(DEFAULT_SLA_MS))
    work_ms: np.ndarray = dataclasses.field(default_factory=lambda: np.empty(0))  # work at rate 1 (noise in)
    served_ms: np.ndarray = dataclasses.field(default_factory=lambda: np.empty(0))  # work served by the end
    node_gpu_demand: np.ndarray = dataclasses.field(default_factory=lambda: np.empty(0))
    window_s: float | None = None  # closed loop: the submission window (throughput counts within it)
    events: tuple[NodeEvent, ...] = ()  # the run's node events as resolved (seconds, nodes named)

    @property
    def rtt_ms(self) -> np.ndarray:
        return (self.finish_s - self.submit_s) * 1000.0

    @property
    def ok(self) -> np.ndarray:
        return (self.node_idx >= 0) & np.isfinite(self.finish_s)

    def task_node_class(self) -> np.ndarray:
        classes = np.array(self.node_classes + ("none",))
        return classes[np.where(self.node_idx >= 0, self.node_idx, len(self.node_classes))]

    def accuracy(self) -> dict[str, float]:
        """``1 - MAPE`` per ``app:node_class`` over tasks after warm-up that carry a prediction."""
        n = len(self.apps)
        after = np.arange(n) >= int(WARMUP_FRACTION * n)
        pred = self.predicted_ms
        rtt = self.rtt_ms
        usable = after & self.ok & np.isfinite(pred) & (rtt > 0)
        apps = np.array(self.apps)
        classes = self.task_node_class()
        out: dict[str, float] = {}
        for app in sorted(set(self.apps)):
            for cls in ("gpu", "cpu"):
                m = usable & (apps == app) & (classes == cls)
                if m.sum() >= 10:
                    mape = float(np.mean(np.abs(pred[m] - rtt[m]) / rtt[m]))
                    out[f"acc:{app}:{cls}"] = 1.0 - mape
        return out

    def throughput(self) -> float:
        """Completed tasks per second (see the module docstring)."""
        ok = self.ok
        if not ok.any():
            return 0.0
        if self.window_s is not None:
            return float(np.sum(self.finish_s[ok] <= self.window_s) / self.window_s)
        span = float(self.finish_s[ok].max() - np.nanmin(self.submit_s))
        return float(ok.sum() / span) if span > 0 else float("nan")

    def summary(self) -> dict[str, float]:
        ok = self.ok
        rtt = self.rtt_ms[ok]
        wait = (self.start_s[ok] - self.submit_s[ok]) * 1000.0
        apps = np.array(self.apps)[ok]
        sla = np.array([self.sla_ms.get(a, np.inf) for a in apps])
        gpu = self.node_gpu_util[np.isfinite(self.node_gpu_util)]
        demand = self.node_gpu_demand[np.isfinite(self.node_gpu_demand)]
        util = self.node_util[np.isfinite(self.node_util)]
        empty = not rtt.size
        out: dict[str, float] = {
            "tasks": float(ok.sum()),
            "failed": float(self.failed),
            "mean_rtt_ms": float("nan") if empty else float(rtt.mean()),
            "p95_rtt_ms": float("nan") if empty else float(np.percentile(rtt, 95)),
            "p99_rtt_ms": float("nan") if empty else float(np.percentile(rtt, 99)),
            "rtt_std_ms": float("nan") if empty else float(rtt.std()),
            "queue_ms": float("nan") if empty else float(wait.mean()),
            "queue_p99_ms": float("nan") if empty else float(np.percentile(wait, 99)),
            "throughput": self.throughput(),
            "gpu_util": float(gpu.mean()) if gpu.size else float("nan"),
            "gpu_demand": float(demand.mean()) if demand.size else float("nan"),
            "load_diff": float(100.0 * (util.max() - util.min())) if util.size else float("nan"),
            "load_std": float(100.0 * util.std()) if util.size else float("nan"),
            "sla": float("nan") if empty else float(np.mean(rtt <= sla)),
            "retrains": float(len(self.trace.retrains)),
            "makespan_s": self.makespan_s,
            "tasks_per_wall_s": float(len(self.apps) / self.wall_s) if self.wall_s > 0 else float("nan"),
        }
        for app in sorted(set(self.apps)):
            m = apps == app
            if m.any():
                out[f"mean_rtt_ms:{app}"] = float(rtt[m].mean())
        out.update(self.accuracy())
        return out

    def fingerprint(self) -> str:
        """sha256 over everything a run decides (placements, times, predictions): equal for equal seeds."""
        h = hashlib.sha256()
        for a in (self.node_idx, self.start_s, self.finish_s, self.expected_ms, self.predicted_ms,
                  self.node_gpu_util, self.node_util):
            h.update(np.ascontiguousarray(a).tobytes())
        h.update(repr(self.trace.retrains).encode())
        return h.hexdigest()
