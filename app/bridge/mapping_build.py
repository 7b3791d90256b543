"""Validate a parsed ``mapping.yaml`` document and build a :class:`~app.bridge.mapping.MetricMap`.

Every problem names its path in the file, e.g. ``mapping.yaml: metrics.cpu_iowait.sources[0].kind``.

>>> build({"exporters": {}, "metrics": {"x": {"group": "cpu", "sources": [{"kind": "gauge"}]}}}, "m.yaml")
Traceback (most recent call last):
...
app.bridge.errors.MappingError: m.yaml: metrics.x.sources[0].metric: required
"""

from __future__ import annotations

import math
import re
from typing import Any

from app.bridge.errors import MappingError
from app.bridge.mapping_types import (
    AGGREGATES,
    KINDS,
    UNITS,
    CanonicalMetric,
    ExporterSpec,
    GpuLabels,
    GpuLoss,
    HealthCheck,
    LabelMatch,
    MetricMap,
    Source,
    Watchdog,
    stale_groups,
)
from app.bridge.ranges import NON_NEGATIVE, default_tolerance
from app.contracts.names import METRIC_NAME_MAX_LENGTH, metric_name_ok


class _Path:
    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, where: str, message: str) -> MappingError:
        return MappingError(f"{self.file}: {where}", message)


def _obj(p: _Path, where: str, v: Any) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise p.fail(where, f"must be a mapping (got {type(v).__name__})")
    return v


def _str(p: _Path, where: str, v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise p.fail(where, "required" if v is None else f"must be a non-empty string (got {v!r})")
    return v


def _strs(p: _Path, where: str, v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list):
        raise p.fail(where, "must be a list")
    return tuple(_str(p, f"{where}[{i}]", x) for i, x in enumerate(v))


def _groups(p: _Path, where: str, v: Any) -> tuple[str, ...]:
    allowed = stale_groups()
    out = _strs(p, where, v)
    for g in out:
        if g not in allowed:
            raise p.fail(where, f"unknown group {g!r}; the node-metrics contract allows {list(allowed)}")
    return out


def _names(p: _Path, where: str, v: Any) -> tuple[str, ...]:
    """One metric name or a list of them."""
    return (_str(p, where, v),) if isinstance(v, str) else _strs(p, where, v)


def _number(p: _Path, where: str, v: Any, low: float = 0.0) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < low:
        raise p.fail(where, f"must be a number >= {low:g} (got {v!r})")
    return float(v)


def _labels(p: _Path, where: str, v: Any) -> LabelMatch:
    if v is None:
        return ()
    out = []
    for k, pattern in _obj(p, where, v).items():
        try:
            out.append((str(k), re.compile(str(pattern))))
        except re.error as exc:
            raise p.fail(f"{where}.{k}", f"invalid regular expression: {exc}") from None
    return tuple(out)


def _source(p: _Path, where: str, raw: Any) -> Source:
    d = _obj(p, where, raw)
    kind = d.get("kind", "gauge")
    if kind not in KINDS:
        raise p.fail(f"{where}.kind", f"must be one of {list(KINDS)} (got {kind!r})")
    unit = d.get("unit", "count")
    if unit not in UNITS:
        raise p.fail(f"{where}.unit", f"must be one of {sorted(UNITS)} (got {unit!r})")
    scale = d.get("scale", 1.0)
    if not isinstance(scale, int | float) or not math.isfinite(scale) or scale == 0:
        raise p.fail(f"{where}.scale", f"must be a finite non-zero number (got {scale!r})")
    needs_denominator = kind in ("ratio", "counter_ratio")
    denominator = _names(p, f"{where}.denominator", d.get("denominator")) if needs_denominator else ()
    if needs_denominator and not denominator:
        raise p.fail(f"{where}.denominator", "required")
    plus = _names(p, f"{where}.plus", d.get("plus")) if kind == "sum" else ()
    if kind == "sum" and not plus:
        raise p.fail(f"{where}.plus", "required")
    src = Source(
        kind=kind, metric=_str(p, f"{where}.metric", d.get("metric")), scale=UNITS[unit] * float(scale),
        match=_labels(p, f"{where}.match", d.get("match")), exclude=_labels(p, f"{where}.exclude", d.get("exclude")),
        denominator=denominator, plus=plus, complement=bool(d.get("complement", False)),
        label=_str(p, f"{where}.label", d.get("label")) if kind == "label_count" else None,
    )
    unknown = set(d) - {"kind", "metric", "unit", "scale", "match", "exclude", "denominator", "plus", "complement",
                        "label"}
    if unknown:
        raise p.fail(where, f"unknown keys {sorted(unknown)}")
    return src


def _metric(p: _Path, name: str, raw: Any) -> CanonicalMetric:
    where = f"metrics.{name}"
    if not metric_name_ok(name):  # every scrape carrying it would be dead-lettered by the worker
        raise p.fail(where, "not a metric name of the node-metrics contract: a letter or '_' then letters, digits, "
                            f"'_', '.', ':', '-', at most {METRIC_NAME_MAX_LENGTH} characters (got {name!r})")
    d = _obj(p, where, raw)
    group = _str(p, f"{where}.group", d.get("group"))
    _groups(p, f"{where}.group", [group])
    aggregate = d.get("aggregate", "sum")
    if aggregate not in AGGREGATES:
        raise p.fail(f"{where}.aggregate", f"must be one of {list(AGGREGATES)} (got {aggregate!r})")
    bounds = d.get("range")
    rng: tuple[float, float] | None = None
    if bounds is not None:
        if not (isinstance(bounds, list) and len(bounds) == 2 and all(isinstance(b, int | float) for b in bounds)
                and bounds[0] <= bounds[1]):
            raise p.fail(f"{where}.range", f"must be [low, high] with low <= high (got {bounds!r})")
        rng = (float(bounds[0]), float(bounds[1]))
    tolerance = 0.0
    if "tolerance" in d:
        if rng is None:
            raise p.fail(f"{where}.tolerance", "needs a range")
        tolerance = _number(p, f"{where}.tolerance", d["tolerance"])
    elif rng is not None:
        tolerance = default_tolerance(rng)
    if rng is None:  # every canonical unit but celsius is non-negative: a negative reading is no reading
        rng = NON_NEGATIVE
    unknown = set(d) - {"group", "aggregate", "range", "tolerance", "sources"}
    if unknown:
        raise p.fail(where, f"unknown keys {sorted(unknown)}")
    sources = d.get("sources")
    if not isinstance(sources, list) or not sources:
        raise p.fail(f"{where}.sources", "must be a non-empty list")
    return CanonicalMetric(
        name=name, group=group, aggregate=aggregate, range=rng, tolerance=tolerance,
        sources=tuple(_source(p, f"{where}.sources[{i}]", s) for i, s in enumerate(sources)),
    )


def _exporter(p: _Path, name: str, raw: Any) -> ExporterSpec:
    where = f"exporters.{name}"
    d = _obj(p, where, raw)
    groups = _groups(p, f"{where}.groups", d.get("groups"))
    health = []
    for i, h in enumerate(d.get("health") or []):
        hw = f"{where}.health[{i}]"
        hd = _obj(p, hw, h)
        ok = hd.get("ok")
        if not isinstance(ok, int | float):
            raise p.fail(f"{hw}.ok", f"must be a number (got {ok!r})")
        hg = _groups(p, f"{hw}.groups", hd["groups"]) if "groups" in hd else groups
        health.append(HealthCheck(_str(p, f"{hw}.metric", hd.get("metric")), float(ok), hg,
                                  _labels(p, f"{hw}.match", hd.get("match"))))
    blanks = []
    for i, r in enumerate(d.get("blank_ranges") or []):
        if not (isinstance(r, list) and len(r) == 2 and all(isinstance(b, int | float) for b in r)):
            raise p.fail(f"{where}.blank_ranges[{i}]", f"must be [low, high] (got {r!r})")
        blanks.append((float(r[0]), float(r[1])))
    identity, boot = _identity(p, f"{where}.identity", d.get("identity"))
    port = d.get("port")
    if port is not None and not (isinstance(port, int) and 0 < port < 65536):
        raise p.fail(f"{where}.port", f"must be a port number (got {port!r})")
    return ExporterSpec(
        name=name, groups=groups, detect=_strs(p, f"{where}.detect", d.get("detect")),
        detect_prefix=d.get("detect_prefix"), port=port, gpu=bool(d.get("gpu", False)),
        clock=d.get("clock"), blank_ranges=tuple(blanks), health=tuple(health),
        required=_strs(p, f"{where}.required", d.get("required")), identity=identity, boot=boot,
    )


def _identity(p: _Path, where: str, raw: Any) -> tuple[tuple[tuple[str, tuple[str, ...]], ...], str | None]:
    """``{labels: {metric: label or [labels]}, boot: metric}``: what tells an exporter's host apart. A label
    may be a list of its spellings (``[Hostname, hostname]``): the first one a sample carries is read."""
    if raw is None:
        return (), None
    d = _obj(p, where, raw)
    unknown = set(d) - {"labels", "boot"}
    if unknown:
        raise p.fail(where, f"unknown keys {sorted(unknown)}")
    pairs = []
    for metric, labels in _obj(p, f"{where}.labels", d.get("labels") or {}).items():
        given = labels if isinstance(labels, list) else [labels]
        if not given:
            raise p.fail(f"{where}.labels.{metric}", "needs a label")
        for i, label in enumerate(given):
            spellings = _names(p, f"{where}.labels.{metric}" + (f"[{i}]" if isinstance(labels, list) else ""), label)
            if not spellings:
                raise p.fail(f"{where}.labels.{metric}[{i}]", "needs a spelling of the label")
            pairs.append((str(metric), spellings))
    boot = _str(p, f"{where}.boot", d["boot"]) if d.get("boot") is not None else None
    if not pairs and boot is None:
        raise p.fail(where, "needs labels or boot")
    return tuple(pairs), boot


def build(doc: Any, file: str) -> MetricMap:
    """Validate the parsed YAML document ``doc`` of ``file``."""
    p = _Path(file)
    d = _obj(p, "(top)", doc)
    exporters = {str(k): _exporter(p, str(k), v) for k, v in _obj(p, "exporters", d.get("exporters", {})).items()}
    metrics = tuple(_metric(p, str(k), v) for k, v in _obj(p, "metrics", d.get("metrics")).items())
    gpu_model = []
    for i, g in enumerate(d.get("gpu_model") or []):
        gd = _obj(p, f"gpu_model[{i}]", g)
        gpu_model.append((_str(p, f"gpu_model[{i}].metric", gd.get("metric")),
                          _str(p, f"gpu_model[{i}].label", gd.get("label"))))
    watchdog = _watchdog(p, d["watchdog"], metrics) if d.get("watchdog") is not None else None
    gpu_lost = _gpu_lost(p, d["gpu_lost"], exporters) if d.get("gpu_lost") is not None else None
    return MetricMap(exporters=exporters, metrics=metrics, gpu_model=tuple(gpu_model), watchdog=watchdog,
                     gpu_lost=gpu_lost)


def _watchdog(p: _Path, raw: Any, metrics: tuple[CanonicalMetric, ...]) -> Watchdog:
    w = _obj(p, "watchdog", raw)
    known = {m.name for m in metrics}

    def canonical(key: str, value: Any) -> str:
        v = _str(p, f"watchdog.{key}", value)
        if v not in known:
            raise p.fail(f"watchdog.{key}", f"{v!r} is not a canonical metric of this file")
        return v

    activity = tuple(canonical(f"activity[{i}]", v) for i, v in enumerate(_names(p, "watchdog.activity",
                                                                                 w.get("activity"))))
    flat = _number(p, "watchdog.flat_for_s", w.get("flat_for_s", 30.0))
    memory_activity = w.get("memory_activity")
    return Watchdog(
        utilization=canonical("utilization", w.get("utilization")), memory=canonical("memory", w.get("memory")),
        memory_activity=canonical("memory_activity", memory_activity) if memory_activity is not None else None,
        activity=activity, flat_for_s=flat, groups=_groups(p, "watchdog.groups", w.get("groups")),
    )


def _gpu_lost(p: _Path, raw: Any, exporters: dict[str, ExporterSpec]) -> GpuLoss:
    """``{known_after_s, forget_after_s, exporters: {name: {uuid, index, model, xid}}}``."""
    d = _obj(p, "gpu_lost", raw)
    unknown = set(d) - {"known_after_s", "forget_after_s", "exporters"}
    if unknown:
        raise p.fail("gpu_lost", f"unknown keys {sorted(unknown)}")
    labels = {}
    for name, entry in _obj(p, "gpu_lost.exporters", d.get("exporters") or {}).items():
        where = f"gpu_lost.exporters.{name}"
        spec = exporters.get(str(name))
        if spec is None or not spec.gpu:
            raise p.fail(where, f"{name!r} is no GPU exporter of this file")
        e = _obj(p, where, entry)
        extra = set(e) - {"uuid", "index", "model", "xid"}
        if extra:
            raise p.fail(where, f"unknown keys {sorted(extra)}")
        optional = {k: _str(p, f"{where}.{k}", e[k]) for k in ("index", "model", "xid") if e.get(k) is not None}
        labels[str(name)] = GpuLabels(uuid=_str(p, f"{where}.uuid", e.get("uuid")), **optional)
    if not labels:
        raise p.fail("gpu_lost.exporters", "must name at least one GPU exporter")
    known = _number(p, "gpu_lost.known_after_s", d.get("known_after_s", 30.0))
    forget = _number(p, "gpu_lost.forget_after_s", d.get("forget_after_s", 3600.0))
    if forget <= known:
        raise p.fail("gpu_lost.forget_after_s", f"must be more than known_after_s ({known:g}), got {forget:g}")
    return GpuLoss(exporters=labels, known_after_s=known, forget_after_s=forget)
