"""Evaluate the canonical metrics of one node from the cleaned scrapes of its exporters.

For each canonical metric the sources are tried in order; the first whose exporter metric has a usable
sample *claims* the metric -- even when it cannot give a value yet (a counter's first scrape), so that a
node never alternates between two sources. Per series, values are scaled into canonical units and checked
against the metric's ``range`` (an out-of-range reading, e.g. DCGM's occasional 808334905 % utilisation,
is dropped); the series are then aggregated (``sum``, ``mean``, ``max``, ``min``).

>>> from app.bridge.exposition import parse_exposition
>>> from app.bridge.mapping import load_mapping
>>> e = parse_exposition('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 50\\nDCGM_FI_DEV_GPU_UTIL{gpu="1"} 100\\n')
>>> values = evaluate(load_mapping(), [Part("dcgm_exporter", e, {})])
>>> values["nvidia_smi_utilization_gpu"].value, values["gpu_count"].value
(0.75, 2.0)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

from app.bridge.exposition import Exposition, Sample
from app.bridge.mapping import CanonicalMetric, MetricMap, Source
from app.bridge.rates import Delta

RANGE_TOLERANCE = 1e-9


def series_key(s: Sample) -> tuple[str, tuple[tuple[str, str], ...]]:
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


def _in_range(v: float, rng: tuple[float, float] | None) -> float | None:
    if rng is None:
        return v
    lo, hi = rng
    tol = RANGE_TOLERANCE * max(1.0, abs(lo), abs(hi))
    if v < lo - tol or v > hi + tol:
        return None
    return min(max(v, lo), hi)


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


def _per_series(metric: CanonicalMetric, src: Source, found: list[tuple[Part, Sample]]) -> float | None:
    vals: list[float] = []
    for part, s in found:
        if src.kind == "gauge":
            v: float | None = s.value * src.scale
        else:
            d = part.deltas.get(series_key(s))
            v = d.rate * src.scale if d is not None else None
        v = _in_range(v, metric.range) if v is not None else None
        if v is not None:
            vals.append(v)
    return _aggregate(vals, metric.aggregate)


def _share(parts: Sequence[Part], src: Source) -> float | None:
    total = selected = 0.0
    for p in parts:
        for s in p.exposition.get(src.metric):
            d = p.deltas.get(series_key(s))
            if d is None:
                return None  # a series without an increase (new, reset): skip the whole share
            total += d.increase
            if src.selects(s.labels):
                selected += d.increase
    return selected / total * src.scale if total > 0 else None


def _ratio(parts: Sequence[Part], src: Source, found: list[tuple[Part, Sample]]) -> float | None:
    assert src.denominator is not None
    den = _samples(parts, src.denominator, src)
    if not den:
        return None
    d = _fsum(s.value for _, s in den)
    if d <= 0:
        return None
    r = _fsum(s.value for _, s in found) / d
    return (1.0 - r if src.complement else r) * src.scale


Found = list[tuple[Part, Sample]]


def _value(metric: CanonicalMetric, src: Source, parts: Sequence[Part], found: Found) -> float | None:
    if src.kind in ("gauge", "counter"):
        return _per_series(metric, src, found)
    if src.kind == "share":
        v = _share(parts, src)
    elif src.kind == "ratio":
        v = _ratio(parts, src, found)
    else:
        v = float(len({s.labels.get(src.label or "") for _, s in found})) * src.scale
    return _in_range(v, metric.range) if v is not None else None


def evaluate(mapping: MetricMap, parts: Sequence[Part]) -> dict[str, Value]:
    """Every canonical metric that has a value in this scrape of the node."""
    out: dict[str, Value] = {}
    for metric in mapping.metrics:
        for src in metric.sources:
            found = _samples(parts, src.metric, src)
            if not found:
                continue
            v = _value(metric, src, parts, found)
            if v is not None and math.isfinite(v):
                out[metric.name] = Value(v, found[0][0].exporter)
            break
    return out
