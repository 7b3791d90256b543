"""The heuristic a competent operator writes by hand: a calibrated RTT table times a contention factor.

Before scheduling, the operator measures every hardware class once on idle nodes
(:mod:`app.sim.policies.calibration`): an RTT line ``a + b * input_mb`` per (class, app) and one factor
``k`` for how much each co-running task slows a task down. A task then goes to the candidate with the
lowest

``(a + b * input_mb) * (1 + k * running_tasks(node))``

where ``running_tasks`` is the scheduler's own count of the pods it placed there that still run. A node of
a class not seen before (one joining later) is calibrated when it first shows up, and ``k`` refitted on
everything measured. The table is static: it never sees a node slow down, a noisy neighbour or a
throttled GPU, except through the running-task count when tasks there take longer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.sim.hardware import NodeSpec
from app.sim.policies.base import BasePolicy
from app.sim.policies.calibration import Sample, fit, hardware_class, measure
from app.sim.view import ClusterView, Task


class StaticBest(BasePolicy):
    """See the module docstring. ``k``: a fixed contention factor instead of the fitted one."""

    name = "static_best"

    def __init__(self, rng: np.random.Generator, *, k: float | None = None) -> None:
        super().__init__()
        if k is not None and k < 0:
            raise ValueError(f"StaticBest.k: must be >= 0 (got {k})")
        self._rng = rng
        self._fixed_k = k
        self._samples: dict[NodeSpec, Sequence[Sample]] = {}
        self._class: dict[str, NodeSpec] = {}  # node name -> hardware class
        self.table: dict[tuple[NodeSpec, str], tuple[float, float]] = {}
        self._line: dict[str, dict[str, tuple[float, float]]] = {}  # app -> node name -> (a, b)
        self.k = 0.0

    def calibrate(self, nodes: Sequence[NodeSpec]) -> None:
        """Measure the classes of ``nodes`` not measured yet and refit the table and ``k``."""
        for n in nodes:
            if n.name not in self._class:
                self._class[n.name] = hardware_class(n)
        new = {self._class[n.name] for n in nodes} - set(self._samples)
        if not new:
            return
        for cls in sorted(new, key=repr):
            self._samples[cls] = measure(cls)
        self.table, k = fit(self._samples)
        self.k = self._fixed_k if self._fixed_k is not None else k
        self._line = {}
        self.trace.notes["static_best"] = {"k": self.k, "classes": len(self._samples)}

    def predict_ms(self, task: Task, node: NodeSpec, running: int) -> float:
        cls = self._class.get(node.name) or hardware_class(node)
        a, b = self.table.get((cls, task.app), (float("inf"), 0.0))
        return (a + b * task.input_mb) * (1.0 + self.k * running)

    def choose(self, task: Task, candidates: Sequence[NodeSpec], view: ClusterView) -> NodeSpec:
        if not self._class:
            self.calibrate(view.nodes)
        if any(n.name not in self._class for n in candidates):
            self.calibrate(candidates)
        line = self._line.setdefault(task.app, {})
        for n in candidates:
            if n.name not in line:
                line[n.name] = self.table.get((self._class[n.name], task.app), (float("inf"), 0.0))
        running = view.running_many([n.name for n in candidates])
        mb, k = task.input_mb, self.k
        costs = [(a + b * mb) * (1.0 + k * r) for (a, b), r in zip((line[n.name] for n in candidates), running,
                                                                    strict=True)]
        i = min(range(len(costs)), key=costs.__getitem__)
        if np.isfinite(costs[i]):
            self.trace.predicted_ms[task.idx] = (view.now - task.submit_s) * 1000.0 + costs[i]
        return candidates[i]
