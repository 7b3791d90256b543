"""One node's scrapes -> one node-metrics message (pure: no network, no clock of its own).

A :class:`NodeAssembler` keeps what must survive between scrapes of a node -- counter baselines per
endpoint, which exporter answers where, whether an optional endpoint ever answered -- and turns the results
of one round of scrapes (:class:`TargetResult`) into a :class:`Snapshot`: the message for the node-metrics
topic and the troubles found. Steps, per endpoint: parse (only the metrics the mapping reads), tell which
exporter it is, drop blank and non-finite samples, check the exporter's own health, tell which host answered
(:mod:`app.bridge.identity`), update counter baselines (an interval across two hosts' pages, a clock jump or
counters back and forth gives no rates: listed in ``skips``); then evaluate the canonical metrics over all
endpoints (counting readings clamped into or rejected from their range), check for a hung GPU
(:mod:`app.bridge.gpu_hang`), and withhold the groups of every trouble (listed in ``stale``). An endpoint
that two hosts answer in turn is trouble (``two_hosts``): its exporter's groups are withheld. Each GPU
exporter's endpoint also follows its GPUs by UUID, and a GPU gone from its page or with a fatal Xid is
trouble (``gpu_lost``, :mod:`app.bridge.gpu_lost`) that withholds nothing.

An endpoint that answers 200 without a single sample of the metrics the mapping reads (an exporter's landing
page, a proxy's page, an empty body) has failed its scrape like one that did not answer. A failed endpoint
whose exporter is neither declared nor known (detected before, or guessed from its default port) withholds
every group of the node's class; and a message left without any metric lists every group of its class in
``stale``, so that no consumer takes it for an idle node.

Rates use the exporter's own clock when it sends one (node_exporter's ``node_time_seconds``), else the
bridge's monotonic time at the start of the scrape.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from app.bridge.canonical import Part, evaluate, series_key
from app.bridge.errors import ExpositionError
from app.bridge.exposition import Exposition, Sample, parse_exposition
from app.bridge.gpu_hang import GpuHangCheck
from app.bridge.gpu_lost import GpuWatch
from app.bridge.health import Trouble, scrape_failed, self_reported, two_hosts
from app.bridge.identity import HostWatch, identify
from app.bridge.mapping_types import ExporterSpec, MetricMap, value_bounds
from app.bridge.ranges import RangeTally
from app.bridge.rates import CounterTracker
from app.bridge.targets import Endpoint, Target


@dataclasses.dataclass(frozen=True)
class TargetResult:
    """One endpoint's answer: ``body`` when it answered 200, else ``error``. ``t``: monotonic start time."""

    url: str
    t: float
    body: str | None = None
    error: str | None = None
    duration_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class Skip:
    """An endpoint's interval whose counters gave no rates (all of them; ``counter_reset``: some series)."""

    url: str
    reason: str  # clock_jump | host_changed | counter_bounce | counter_reset
    detail: str


@dataclasses.dataclass(frozen=True)
class Snapshot:
    message: dict[str, Any]
    troubles: tuple[Trouble, ...]
    dropped: dict[str, int]  # exporter -> samples dropped as blank / non-finite
    clamped: dict[str, int] = dataclasses.field(default_factory=dict)  # canonical metric -> readings clamped
    rejected: dict[str, int] = dataclasses.field(default_factory=dict)  # ... rejected as far out of range
    failed: frozenset[str] = frozenset()  # urls without a usable exposition: no 200, invalid, or no sample read
    skips: tuple[Skip, ...] = ()
    forgotten: tuple[Trouble, ...] = ()  # lost GPUs missing so long that they are no longer reported


@dataclasses.dataclass
class _EndpointState:
    tracker: CounterTracker = dataclasses.field(default_factory=CounterTracker)
    hosts: HostWatch = dataclasses.field(default_factory=HostWatch)
    exporter: str | None = None
    answered: bool = False
    gpus: GpuWatch | None = None


def detect_exporter(mapping: MetricMap, exposition: Exposition) -> str | None:
    """The exporter that wrote an exposition, from its tell-tale metric names."""
    for spec in mapping.exporters.values():
        if any(name in exposition for name in spec.detect):
            return spec.name
    for spec in mapping.exporters.values():
        if spec.detect_prefix and any(n.startswith(spec.detect_prefix) for n in exposition.samples):
            return spec.name
    return None


def class_groups(mapping: MetricMap, node_class: str) -> tuple[str, ...]:
    """The metric groups a node of ``node_class`` reports: its exporters' (a cpu node's: no GPU exporter's)."""
    return tuple(sorted({g for e in mapping.exporters.values() if node_class == "gpu" or not e.gpu
                         for g in e.groups}))


NO_SAMPLES = "HTTP 200 without any metric the bridge reads (not an exporter's /metrics page?)"


def clean(exposition: Exposition, spec: ExporterSpec | None) -> tuple[Exposition, int]:
    """Without NaN, infinities and the exporter's blank sentinels; returns the number dropped."""
    dropped = 0
    out: dict[str, list[Sample]] = {}
    for name, samples in exposition.samples.items():
        keep = [s for s in samples if not (spec.is_blank(s.value) if spec else not math.isfinite(s.value))]
        dropped += len(samples) - len(keep)
        if keep:
            out[name] = keep
    return Exposition(out), dropped


class NodeAssembler:
    """Turns each round of one node's scrapes into its node-metrics message."""

    def __init__(self, target: Target, mapping: MetricMap) -> None:
        self.target = target
        self.mapping = mapping
        self._state = {e.url: _EndpointState() for e in target.endpoints}
        self._endpoints = {e.url: e for e in target.endpoints}
        self._gpu_seen = False
        self._bounds = value_bounds()
        self._gpu_check = GpuHangCheck(mapping.watchdog) if mapping.watchdog is not None else None
        self._class_groups = {c: class_groups(mapping, c) for c in ("cpu", "gpu")}  # fixed by the mapping

    def exporter_name(self, endpoint: Endpoint) -> str:
        """Declared, else the last detected, else guessed from the default port, else ``unknown``."""
        st = self._state[endpoint.url]
        by_port = self.mapping.by_port(endpoint.port)
        return endpoint.exporter or st.exporter or (by_port.name if by_port else "unknown")

    def _counter_values(self, exposition: Exposition) -> dict[object, float]:
        return {series_key(s): s.value for name in self.mapping.counter_metrics for s in exposition.get(name)}

    def assemble(self, results: Sequence[TargetResult], ts: float, gpu_pods: int | None = None) -> Snapshot:
        """The message of one round of scrapes taken at wall-clock ``ts``.

        ``gpu_pods``: pods of GPU apps running on the node per the running-pods view (None: no view).
        """
        parts: list[Part] = []
        troubles: list[Trouble] = []
        dropped: dict[str, int] = {}
        failed: set[str] = set()
        skips: list[Skip] = []
        forgotten: list[Trouble] = []
        for r in results:
            endpoint, st = self._endpoints[r.url], self._state[r.url]
            error, exposition = r.error, None
            if r.body is not None:
                try:
                    exposition = parse_exposition(r.body, keep=self.mapping.wanted, page=True)
                except ExpositionError as exc:
                    error = str(exc)
                if exposition is not None and not exposition.samples:
                    exposition, error = None, NO_SAMPLES
            if exposition is None:
                failed.add(r.url)
                if not (endpoint.optional and not st.answered):
                    name = self.exporter_name(endpoint)
                    troubles.append(scrape_failed(name, self.mapping.exporters.get(name), error or "no answer"))
                if st.gpus is not None:  # a page that did not come tells nothing of its GPUs
                    troubles.extend(st.gpus.repeat())
                continue
            st.answered = True
            st.exporter = endpoint.exporter or detect_exporter(self.mapping, exposition) or st.exporter
            name = self.exporter_name(endpoint)
            spec = self.mapping.exporters.get(name)
            exposition, n = clean(exposition, spec)
            if n:
                dropped[name] = dropped.get(name, 0) + n
            own = self_reported(spec, exposition) if spec is not None else []
            troubles.extend(own)
            if spec is not None:
                self._gpu_seen |= spec.gpu and any(exposition.get(n) for n in spec.required)
            clock = exposition.get(spec.clock) if spec and spec.clock else []
            t, source = (clock[0].value, "exporter") if clock else (r.t, "bridge")
            ident = identify(spec, exposition, r.t) if spec is not None else None
            other = ident is not None and st.hosts.observe(ident, r.t)
            deltas = st.tracker.observe(self._counter_values(exposition), t, source, r.t, other_host=other)
            if st.tracker.skipped is not None:
                detail = st.tracker.detail
                if other and st.hosts.change is not None:
                    detail = f"answered as {st.hosts.change[1]}, the previous page as {st.hosts.change[0]}"
                skips.append(Skip(r.url, st.tracker.skipped, detail))
            if st.tracker.skipped == "counter_bounce":
                st.hosts.bounced(r.t)
            two = st.hosts.two_hosts(r.t)
            if two:
                troubles.append(two_hosts(name, spec, r.url, st.hosts.hosts))
            watch = self._gpu_watch(st, name)
            if watch is not None:
                if other:  # another host's page: the GPUs remembered are not its GPUs, unless it lists one
                    watch.host_changed(exposition)
                tells = not two and not any(t.kind == "collector_failed" for t in own)
                troubles.extend(watch.observe(exposition, ts) if tells else watch.repeat())
                forgotten.extend(watch.forgotten)
            parts.append(Part(name, exposition, deltas))
        tally = RangeTally()
        values = evaluate(self.mapping, parts, tally)
        if self._gpu_check is not None:
            util = values.get(self._gpu_check.watchdog.utilization)
            trouble = self._gpu_check.observe({k: v.value for k, v in values.items()}, ts, gpu_pods,
                                              util.exporter if util else "")
            if trouble:
                troubles.append(trouble)
        node_class = self.target.node_class or ("gpu" if self._gpu_seen else "cpu")
        every = self._class_groups[node_class]
        # a failed or two-host endpoint of no known exporter: which groups it served is unknown, so all of them
        troubles = [dataclasses.replace(t, groups=every)
                    if t.kind in ("scrape_failed", "two_hosts") and t.exporter not in self.mapping.exporters else t
                    for t in troubles]
        stale = sorted({g for t in troubles for g in t.groups})
        groups = {m.name: m.group for m in self.mapping.metrics}
        lo, hi = self._bounds
        metrics = {k: v.value for k, v in values.items() if groups[k] not in stale and lo <= v.value <= hi}
        if not metrics:  # nothing to read this node by: every group withheld, never an idle-looking node
            stale = sorted({*stale, *every})
        message: dict[str, Any] = {
            "node": self.target.node, "ts": ts, "node_class": node_class,
            "gpu_model": self._gpu_model(parts) if node_class == "gpu" else None,
            "metrics": metrics, "stale": stale,
        }
        return Snapshot(message, tuple(troubles), dropped, dict(tally.clamped), dict(tally.rejected),
                        frozenset(failed), tuple(skips), tuple(forgotten))

    def _gpu_watch(self, st: _EndpointState, name: str) -> GpuWatch | None:
        """The endpoint's :class:`GpuWatch` when its exporter is one the lost-GPU check reads."""
        loss = self.mapping.gpu_lost
        labels = loss.exporters.get(name) if loss is not None else None
        if loss is None or labels is None:
            st.gpus = None
        elif st.gpus is None or st.gpus.exporter != name:
            st.gpus = GpuWatch(name, labels, loss)
        return st.gpus

    def _gpu_model(self, parts: Sequence[Part]) -> str | None:
        if self.target.gpu_model:
            return self.target.gpu_model
        for metric, label in self.mapping.gpu_model:
            for p in parts:
                for s in p.exposition.get(metric):
                    if s.labels.get(label):
                        return s.labels[label][:128]
        return None
