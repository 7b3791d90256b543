"""Non-stationarity: thermal throttling, a noisy neighbour, a node slowing down (a node joining is
:attr:`app.sim.hardware.NodeSpec.join_at_s`).

Each event acts on one node between ``start_s`` and ``end_s`` (simulated seconds):

- ``throttle``: the GPU clocks down by ``factor``; GPU work runs ``factor`` x slower; visible as a hot GPU
  and a lower SM clock in the metrics.
- ``neighbour``: a process outside the cluster's control adds ``loads`` (per resource, same units as task
  demands) - it slows co-located tasks and shows in the metrics.
- ``slowdown``: everything on the node runs ``factor`` x slower and *no metric shows it* (a failing disk
  controller, a bad DIMM): only the RTT feedback can notice.
- ``leave``: the node is cordoned at ``start_s`` (no new task is bound to it; running ones finish).

Every change re-rates the tasks running on the node (:meth:`app.sim.state.NodeRuntime.rerate`).

A scenario names its events as :class:`EventSpec` (times in seconds, or fractions of the run), which
:func:`resolve` turns into node events and joining nodes for a given cluster and run length.

>>> from app.sim.hardware import small_preset
>>> evs = default_events(small_preset(), duration_s=100.0)
>>> [(e.kind, e.node) for e in evs]
[('throttle', 'worker-3'), ('neighbour', 'worker-2'), ('slowdown', 'cpu-2')]
>>> spec = EventSpec("slowdown", "@fastest-gpu", at=0.4, relative=True, factor=3.0)
>>> resolve([spec], small_preset(), span_s=200.0)[1]
[NodeEvent(kind='slowdown', node='worker-3', start_s=80.0, end_s=inf, factor=3.0, loads={})]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from app.sim.hardware import NodeSpec

KINDS = ("throttle", "neighbour", "slowdown", "leave")
SELECTORS = ("@fastest-gpu", "@slowest-gpu")


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
        if self.kind in ("throttle", "slowdown") and self.factor < 1.0:
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
        elif ev.kind == "neighbour":
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


@dataclasses.dataclass(frozen=True)
class EventSpec:
    """One scripted event: a :data:`KINDS` event on ``node``, or ``join`` (``node`` is then the joining node,
    described by ``spec``). ``node`` may be a selector (:data:`SELECTORS`) over the GPU nodes present at the
    start. ``at``/``until`` are seconds, or fractions of the run when ``relative``."""

    kind: str
    node: str
    at: float
    until: float = math.inf
    relative: bool = False
    factor: float = 1.0
    loads: Mapping[str, float] = dataclasses.field(default_factory=dict)
    spec: NodeSpec | None = None

    def __post_init__(self) -> None:
        if self.kind not in (*KINDS, "join"):
            raise ValueError(f"events.kind: must be one of {(*KINDS, 'join')} (got {self.kind!r})")
        if self.kind == "join" and self.spec is None:
            raise ValueError("events.spec: a join needs the joining node's description")


def _select(selector: str, nodes: Sequence[NodeSpec]) -> str:
    if not selector.startswith("@"):
        return selector
    gpus = [n for n in nodes if n.gpu is not None and n.join_at_s <= 0]
    if selector not in SELECTORS or not gpus:
        raise ValueError(f"events.node: {selector!r} is not a selector of this cluster (known: {SELECTORS})")
    speed = [n.gpu.fp32_tflops if n.gpu else 0.0 for n in gpus]
    pick = max if selector == "@fastest-gpu" else min
    return gpus[speed.index(pick(speed))].name


def resolve(specs: Sequence[EventSpec], nodes: Sequence[NodeSpec],
            span_s: float) -> tuple[list[NodeSpec], list[NodeEvent]]:
    """(joining nodes, node events) of ``specs`` on ``nodes`` for a run of ``span_s`` seconds."""
    joins: list[NodeSpec] = []
    events: list[NodeEvent] = []
    scale = max(span_s, 1e-9)
    for s in specs:
        at = s.at * scale if s.relative else s.at
        until = s.until * scale if (s.relative and math.isfinite(s.until)) else s.until
        if s.kind == "join":
            assert s.spec is not None
            joins.append(dataclasses.replace(s.spec, name=s.node, join_at_s=round(max(at, 1e-6), 6)))
            continue
        events.append(NodeEvent(s.kind, _select(s.node, nodes), at, until, factor=s.factor, loads=dict(s.loads)))
    return joins, events
