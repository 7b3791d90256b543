"""Evaluate the canonical metrics of one node from the cleaned scrapes of its exporters.

For each canonical metric the sources are tried in order; the first whose exporter metrics (all those it
combines) have a usable sample *claims* the metric -- even when it cannot give a value yet (a counter's
first scrape), so that a node never alternates between two sources. Per series, values are scaled into
canonical units and checked against the metric's ``range`` (:mod:`app.bridge.ranges`: slightly outside
is clamped, far outside rejected, both counted); the series are then aggregated (``sum``, ``mean``,
``max``, ``min``).

Kinds that combine several exporter metrics (``ratio``, ``counter_ratio``, ``sum``) pair their samples by
label set: DCGM's ``FB_USED`` and ``FB_FREE`` of one GPU, a disk's read time and reads completed. A series
that lacks one of its partners in a scrape is left out of that scrape's value rather than mixed.

>>> from app.bridge.exposition import parse_exposition
>>> from app.bridge.mapping import load_mapping
>>> e = parse_exposition('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 50\\nDCGM_FI_DEV_GPU_UTIL{gpu="1"} 100\\n'
...                      'DCGM_FI_DEV_FB_USED{gpu="0"} 1024\\nDCGM_FI_DEV_FB_FREE{gpu="0"} 3072\\n')
>>> values = evaluate(load_mapping(), [Part("dcgm_exporter", e, {})])
>>> values["nvidia_smi_utilization_gpu"].value, values["gpu_count"].value, values["gpu_memory_used_fraction"].value
(0.75, 2.0, 0.25)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

from app.bridge.exposition import Exposition, Sample
from app.bridge.mapping_types import CanonicalMetric, MetricMap, Source
from app.bridge.ranges import RangeTally, check
from app.bridge.rates import Delta

LabelKey = tuple[tuple[str, str], ...]


def series_key(s: Sample) -> tuple[str, LabelKey]:
    return s.name, tuple(sorted(s.labels.items()))


@dataclasses.dataclass(frozen=True)
class Part:
    """One exporter's cleaned scrape of the node and its counter increases since the previous scrape."""

    exporter: str
    exposition: Exposition
    deltas: Mapping[object, Delta | None]


@dataclasses.dataclass(frozen=True)
class Value:
    value: float
    exporter: str


def _samples(parts: Sequence[Part], name: str, src: Source) -> list[tuple[Part, Sample]]:
    return [(p, s) for p in parts for s in p.exposition.get(name) if src.selects(s.labels)]


def _fsum(values: Iterable[float]) -> float:
    """An exact sum; infinite when it overflows (such a value is then left out of the message)."""
    try:
        return math.fsum(values)
    except OverflowError:
        return math.inf


def _aggregate(values: list[float], how: str) -> float | None:
    if not values:
        return None
    if how == "mean":
        return _fsum(values) / len(values)
    if how == "max":
        return max(values)
    if how == "min":
        return min(values)
    return _fsum(values)


class _Eval:
    """The evaluation of one metric's source over one scrape of the node."""

    def __init__(self, metric: CanonicalMetric, src: Source, parts: Sequence[Part], tally: RangeTally | None):
        self.metric, self.src, self.parts, self.tally = metric, src, parts, tally

    def checked(self, v: float | None) -> float | None:
        if v is None:
            return None
        return check(v, self.metric.range, self.metric.tolerance, self.metric.name, self.tally)

    def per_series(self, found: list[tuple[Part, Sample]]) -> float | None:
        vals: list[float] = []
        for part, s in found:
            if self.src.kind == "gauge":
                v: float | None = s.value * self.src.scale
            else:
                d = part.deltas.get(series_key(s))
                v = d.rate * self.src.scale if d is not None else None
            v = self.checked(v)
            if v is not None:
                vals.append(v)
        return _aggregate(vals, self.metric.aggregate)

    def share(self) -> float | None:
        total = selected = 0.0
        for p in self.parts:
            for s in p.exposition.get(self.src.metric):
                d = p.deltas.get(series_key(s))
                if d is None:
                    return None  # a series without an increase (new, reset): skip the whole share
                total += d.increase
                if self.src.selects(s.labels):
                    selected += d.increase
        return selected / total * self.src.scale if total > 0 else None

    def joined(self, names: Sequence[str], increases: bool) -> list[list[float]]:
        """Per label set present under every name: the value (or increase) of each name, in order."""
        rows: dict[tuple[int, LabelKey], dict[str, float]] = {}
        unique = list(dict.fromkeys(names))
        for i, p in enumerate(self.parts):
            for name in unique:
                for s in p.exposition.get(name):
                    if not self.src.selects(s.labels):
                        continue
                    if increases:
                        d = p.deltas.get(series_key(s))
                        if d is None:
                            continue
                        v = d.increase
                    else:
                        v = s.value
                    rows.setdefault((i, series_key(s)[1]), {})[name] = v
        return [[row[n] for n in names] for row in rows.values() if len(row) == len(unique)]

    def ratio(self, increases: bool) -> float | None:
        names = [self.src.metric, *self.src.denominator]
        rows = self.joined(names, increases)
        if not rows:
            return None
        den = _fsum(v for row in rows for v in row[1:])
        if den <= 0:
            return None
        r = _fsum(row[0] for row in rows) / den
        return (1.0 - r if self.src.complement else r) * self.src.scale

    def total(self) -> float | None:
        rows = self.joined([self.src.metric, *self.src.plus], increases=False)
        return _fsum(v for row in rows for v in row) * self.src.scale if rows else None

    def value(self, found: list[tuple[Part, Sample]]) -> float | None:
        kind = self.src.kind
        if kind in ("gauge", "counter"):
            return self.per_series(found)
        if kind == "share":
            return self.checked(self.share())
        if kind in ("ratio", "counter_ratio"):
            return self.checked(self.ratio(increases=kind == "counter_ratio"))
        if kind == "sum":
            return self.checked(self.total())
        label = self.src.label or ""
        return self.checked(float(len({s.labels.get(label) for _, s in found})) * self.src.scale)


def evaluate(mapping: MetricMap, parts: Sequence[Part], tally: RangeTally | None = None) -> dict[str, Value]:
    """Every canonical metric that has a value in this scrape of the node.

    ``tally`` (optional) counts the readings clamped into or rejected from each metric's range.
    """
    out: dict[str, Value] = {}
    for metric in mapping.metrics:
        for src in metric.sources:
            found = _samples(parts, src.metric, src)
            if not found or not all(_samples(parts, name, src) for name in src.reads[1:]):
                continue
            v = _Eval(metric, src, parts, tally).value(found)
            if v is not None and math.isfinite(v):
                out[metric.name] = Value(v, found[0][0].exporter)
            break
    return out
