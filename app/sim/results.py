"""What one offline run returns: per-task arrays, per-node utilisation, the policy's trace, and the figures.

Figures (:meth:`RunMetrics.summary`), as the seed's table plus tails and accuracy:

- ``mean_rtt_ms``, ``p95_rtt_ms``, ``p99_rtt_ms``, ``rtt_std_ms`` (completion-time standard deviation)
- ``gpu_util``: time-averaged true GPU utilisation, mean over GPU nodes (0..1)
- ``load_diff``: standard deviation across nodes of each node's time-averaged utilisation (its GPU on a
  GPU node, its CPU on a CPU node), in utilisation units (0..1)
- ``sla``: fraction of tasks whose RTT met their app's SLA
- ``acc:<app>:<class>``: prediction accuracy ``1 - MAPE`` after warm-up, where the policy predicts
- ``retrains``: model retrains the policy triggered
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping

import numpy as np

from app.sim.policies.base import PolicyTrace

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
    expected_ms: np.ndarray
    predicted_ms: np.ndarray
    node_gpu_util: np.ndarray  # time-averaged, NaN on CPU nodes
    node_util: np.ndarray  # time-averaged primary utilisation
    makespan_s: float
    wall_s: float
    failed: int
    trace: PolicyTrace
    sla_ms: Mapping[str, float] = dataclasses.field(default_factory=lambda: dict(DEFAULT_SLA_MS))

    @property
    def rtt_ms(self) -> np.ndarray:
        return (self.finish_s - self.submit_s) * 1000.0

    @property
    def ok(self) -> np.ndarray:
        return self.node_idx >= 0

    def task_node_class(self) -> np.ndarray:
        classes = np.array(self.node_classes + ("none",))
        return classes[np.where(self.ok, self.node_idx, len(self.node_classes))]

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

    def summary(self) -> dict[str, float]:
        ok = self.ok
        rtt = self.rtt_ms[ok]
        apps = np.array(self.apps)[ok]
        sla = np.array([self.sla_ms.get(a, np.inf) for a in apps])
        gpu = self.node_gpu_util[np.isfinite(self.node_gpu_util)]
        out: dict[str, float] = {
            "tasks": float(ok.sum()),
            "failed": float(self.failed),
            "mean_rtt_ms": float(rtt.mean()),
            "p95_rtt_ms": float(np.percentile(rtt, 95)),
            "p99_rtt_ms": float(np.percentile(rtt, 99)),
            "rtt_std_ms": float(rtt.std()),
            "gpu_util": float(gpu.mean()) if gpu.size else float("nan"),
            "load_diff": float(np.nanstd(self.node_util)),
            "sla": float(np.mean(rtt <= sla)),
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
