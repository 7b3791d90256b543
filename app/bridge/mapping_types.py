"""The parsed mapping file's types: exporters, canonical metrics and their sources, health checks, GPU checks.

:func:`app.bridge.mapping.load_mapping` reads ``mapping.yaml`` and :func:`app.bridge.mapping_build.build`
validates it into these; the scraper, canonicaliser and health checks read them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Mapping

from app.contracts import contract

KINDS = ("gauge", "counter", "share", "ratio", "counter_ratio", "sum", "label_count")
COUNTING_KINDS = ("counter", "share", "counter_ratio")  # kinds that read increases between scrapes
AGGREGATES = ("sum", "mean", "max", "min")
# source unit -> factor into the canonical unit (fractions, bytes, MHz, W, celsius, counts, seconds)
UNITS = {
    "fraction": 1.0, "percent": 0.01, "bytes": 1.0, "KB": 1024.0, "KiB": 1024.0, "MiB": 1024.0**2,
    "GiB": 1024.0**3, "Hz": 1e-6, "MHz": 1.0, "W": 1.0, "mW": 1e-3, "celsius": 1.0, "count": 1.0,
    "seconds": 1.0,
}


def stale_groups() -> tuple[str, ...]:
    """The metric groups the node-metrics contract allows in ``stale``."""
    return tuple(contract("node-metrics").value_schema["properties"]["stale"]["items"]["enum"])


def value_bounds() -> tuple[float, float]:
    """The smallest and largest metric value the node-metrics contract accepts."""
    schema = contract("node-metrics").value_schema["properties"]["metrics"]["additionalProperties"]
    return float(schema["minimum"]), float(schema["maximum"])


LabelMatch = tuple[tuple[str, "re.Pattern[str]"], ...]


def _selects(match: LabelMatch, exclude: LabelMatch, labels: Mapping[str, str]) -> bool:
    if any(not p.fullmatch(labels.get(k, "")) for k, p in match):
        return False
    return not any(p.fullmatch(labels.get(k, "")) for k, p in exclude)


@dataclasses.dataclass(frozen=True)
class Source:
    kind: str
    metric: str
    scale: float = 1.0
    match: LabelMatch = ()
    exclude: LabelMatch = ()
    denominator: tuple[str, ...] = ()  # ratio, counter_ratio: summed per series
    plus: tuple[str, ...] = ()  # sum: metrics added to ``metric`` per series
    complement: bool = False
    label: str | None = None

    def selects(self, labels: Mapping[str, str]) -> bool:
        return _selects(self.match, self.exclude, labels)

    @property
    def reads(self) -> tuple[str, ...]:
        """Every exporter metric this source reads."""
        return (self.metric, *self.denominator, *self.plus)


@dataclasses.dataclass(frozen=True)
class CanonicalMetric:
    name: str
    group: str
    sources: tuple[Source, ...]
    aggregate: str = "sum"
    range: tuple[float, float] | None = None
    tolerance: float = 0.0  # how far outside ``range`` a reading is clamped rather than rejected


@dataclasses.dataclass(frozen=True)
class HealthCheck:
    """Trouble when a matching sample of ``metric`` is present and differs from ``ok``."""

    metric: str
    ok: float
    groups: tuple[str, ...]
    match: LabelMatch = ()

    def selects(self, labels: Mapping[str, str]) -> bool:
        return _selects(self.match, (), labels)


@dataclasses.dataclass(frozen=True)
class ExporterSpec:
    name: str
    groups: tuple[str, ...]
    detect: tuple[str, ...] = ()
    detect_prefix: str | None = None
    port: int | None = None
    gpu: bool = False
    clock: str | None = None
    blank_ranges: tuple[tuple[float, float], ...] = ()
    health: tuple[HealthCheck, ...] = ()
    required: tuple[str, ...] = ()
    # (metric, label) pairs that tell the answering host apart; a label as its spellings, the first one a
    # sample has is read (dcgm-exporter's Hostname is hostname on its master)
    identity: tuple[tuple[str, tuple[str, ...]], ...] = ()
    boot: str | None = None  # the host's boot time (unix seconds): another boot is another host's counters

    def is_blank(self, value: float) -> bool:
        """A value that is no reading: NaN, ±inf, or one of the exporter's blank sentinels."""
        if not math.isfinite(value):
            return True
        return any(lo <= value <= hi for lo, hi in self.blank_ranges)


@dataclasses.dataclass(frozen=True)
class Watchdog:
    """The GPU checks of :mod:`app.bridge.gpu_hang`, on canonical metrics of the node."""

    utilization: str
    memory: str
    memory_activity: str | None
    activity: tuple[str, ...]  # counts of work on the GPU: CUDA streams, compute processes
    flat_for_s: float
    groups: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class GpuLabels:
    """How one GPU exporter names a GPU on its page (:mod:`app.bridge.gpu_lost`)."""

    uuid: str  # the label that holds the GPU's UUID: the GPU's name across scrapes
    index: str | None = None  # the label of its index on the node, where the exporter gives one
    model: str | None = None  # the label of its model name
    xid: str | None = None  # the gauge of the last Xid the GPU reported (read for this check only)


@dataclasses.dataclass(frozen=True)
class GpuLoss:
    """The lost-GPU check of :mod:`app.bridge.gpu_lost`: per exporter, its GPU labels; and its times."""

    exporters: dict[str, GpuLabels]
    known_after_s: float  # a GPU on the pages this long is known: from then on its absence is a loss
    forget_after_s: float  # a known GPU missing this long is forgotten (the node drained, the GPU replaced)


@dataclasses.dataclass(frozen=True)
class MetricMap:
    exporters: dict[str, ExporterSpec]
    metrics: tuple[CanonicalMetric, ...]
    gpu_model: tuple[tuple[str, str], ...] = ()
    watchdog: Watchdog | None = None
    gpu_lost: GpuLoss | None = None

    def metric(self, name: str) -> CanonicalMetric:
        for m in self.metrics:
            if m.name == name:
                return m
        raise KeyError(name)

    @functools.cached_property
    def counter_metrics(self) -> frozenset[str]:
        """Exporter metrics whose per-series increases are tracked between scrapes."""
        return frozenset(n for m in self.metrics for s in m.sources if s.kind in COUNTING_KINDS for n in s.reads)

    @functools.cached_property
    def wanted(self) -> frozenset[str]:
        """Every exporter metric the mapping reads: the rest of a scrape is dropped before parsing."""
        names = {n for m in self.metrics for s in m.sources for n in s.reads}
        names |= {metric for metric, _ in self.gpu_model}
        for e in self.exporters.values():
            names |= set(e.detect) | set(e.required) | {h.metric for h in e.health}
            names |= {metric for metric, _ in e.identity} | {n for n in (e.clock, e.boot) if n}
        if self.gpu_lost is not None:
            names |= {g.xid for g in self.gpu_lost.exporters.values() if g.xid}
        return frozenset(names)

    def by_port(self, port: int | None) -> ExporterSpec | None:
        return next((e for e in self.exporters.values() if port is not None and e.port == port), None)
