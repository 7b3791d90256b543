"""The policy seam: ``choose(task, candidates, view) -> node``, plus optional feedback hooks.

It sits below both the cluster that calls it and the policies (:mod:`app.sim.policies`) that implement it.

A policy only ever picks among ``candidates``: nodes that can run the task and have room for it now (the
filter step is the cluster's, as in kube-scheduler). Feedback hooks let a learning policy see what a real
one would see - every scrape, every completion, a periodic tick - and keep a :class:`PolicyTrace` the
report draws from. Baselines inherit no-op hooks from :class:`app.sim.policies.base.BasePolicy`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from app.errors import RttError
from app.sim.hardware import NodeSpec
from app.sim.view import ClusterView, Task


class PolicyError(RttError):
    """A policy chose a node that was not a candidate, or cannot be built."""


@dataclasses.dataclass
class PolicyTrace:
    """What a learning policy did over a run, for the report (all times are simulated seconds)."""

    predicted_ms: dict[int, float] = dataclasses.field(default_factory=dict)  # task idx -> prediction
    retrains: list[tuple[float, str, str]] = dataclasses.field(default_factory=list)  # (t, model key, reason)
    errors: list[tuple[float, str, float]] = dataclasses.field(default_factory=list)  # (t, model key, mape)
    weights: list[tuple[float, str, float]] = dataclasses.field(default_factory=list)  # (t, node, credibility)
    windows: list[tuple[float, str, float]] = dataclasses.field(default_factory=list)  # (t, node:app, window s)
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)


class Policy(Protocol):
    name: str
    trace: PolicyTrace

    def choose(self, task: Task, candidates: Sequence[NodeSpec], view: ClusterView) -> NodeSpec | None:
        """One of ``candidates`` (never empty) for ``task``; None leaves it pending (a scheduler extender's
        filter that fails every candidate), to be tried again at the next completion or join."""
        ...

    def observe_metrics(self, node: str, ts: float, metrics: Mapping[str, float], view: ClusterView) -> None:
        """A scrape of ``node`` (the node-metrics message's fields)."""
        ...

    def observe_completion(self, task: Task, node: str, rtt_ms: float, view: ClusterView) -> None:
        """``task`` finished on ``node`` after ``rtt_ms`` (submit to finish)."""
        ...

    def tick(self, view: ClusterView) -> None:
        """Called after every scrape round (feedback loops keep their own period)."""
        ...
