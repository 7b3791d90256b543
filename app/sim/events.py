"""Non-stationarity: thermal throttling, a noisy neighbour, a node slowing down (a node joining is
:attr:`app.sim.hardware.NodeSpec.join_at_s`).

Each event acts on one node between ``start_s`` and ``end_s`` (simulated seconds):

- ``throttle``: the GPU clocks down by ``factor``; GPU work runs ``factor`` x slower; visible as a hot GPU
  and a lower SM clock in the metrics.
- ``neighbour``: a process outside the cluster's control adds ``loads`` (per resource, same units as task
  demands) - it slows co-located tasks and shows in the metrics.
- ``slowdown``: everything on the node runs ``factor`` x slower and *no metric shows it* (a failing disk
  controller, a bad DIMM): only the RTT feedback can notice.

>>> from app.sim.hardware import small_preset
>>> evs = default_events(small_preset(), duration_s=100.0)
>>> [(e.kind, e.node) for e in evs]
[('throttle', 'worker-3'), ('neighbour', 'worker-2'), ('slowdown', 'cpu-2')]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from app.sim.hardware import NodeSpec

KINDS = ("throttle", "neighbour", "slowdown")


@dataclasses.dataclass(frozen=True)
class NodeEvent:
    kind: str
    node: str
    start_s: float
    end_s: float = math.inf
    factor: float = 1.0
    loads: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"NodeEvent.kind: must be one of {KINDS} (got {self.kind!r})")
        if not (0 <= self.start_s < self.end_s):
            raise ValueError(f"NodeEvent: need 0 <= start_s < end_s (got {self.start_s}, {self.end_s})")
        if self.factor < 1.0:
            raise ValueError(f"NodeEvent.factor: must be >= 1 (got {self.factor})")


@dataclasses.dataclass
class NodeCondition:
    """The mutable part of a node's health, changed by events and read by the service-time model."""

    throttle: float = 1.0
    slowdown: float = 1.0
    background: dict[str, float] = dataclasses.field(default_factory=dict)

    def apply(self, ev: NodeEvent, active: bool) -> None:
        if ev.kind == "throttle":
            self.throttle = ev.factor if active else 1.0
        elif ev.kind == "slowdown":
            self.slowdown = ev.factor if active else 1.0
        else:
            sign = 1.0 if active else -1.0
            for r, v in ev.loads.items():
                self.background[r] = max(0.0, self.background.get(r, 0.0) + sign * v)


def default_events(nodes: Sequence[NodeSpec], duration_s: float) -> list[NodeEvent]:
    """The standard scenario over a run of ``duration_s``: throttle the fastest GPU node in the second
    fifth, a noisy neighbour on another GPU node from mid-run, and a CPU node slowing down for good."""
    gpus = [n for n in nodes if n.node_class == "gpu" and n.join_at_s == 0]
    cpus = [n for n in nodes if n.node_class == "cpu" and n.join_at_s == 0]
    d = max(duration_s, 1.0)
    out: list[NodeEvent] = []
    if gpus:
        fastest = max(gpus, key=lambda n: n.gpu.fp32_tflops if n.gpu else 0.0)
        out.append(NodeEvent("throttle", fastest.name, 0.2 * d, 0.4 * d, factor=1.8))
        others = [n for n in gpus if n.name != fastest.name]
        if others:
            noisy = others[-1]
            out.append(NodeEvent("neighbour", noisy.name, 0.5 * d, 0.8 * d,
                                 loads={"gpu": 0.6, "membw": 0.5, "pcie": 0.3, "cpu": 4.0, "disk": 0.3}))
    if len(cpus) >= 2:
        out.append(NodeEvent("slowdown", cpus[1].name, 0.6 * d, factor=1.6))
    return out
