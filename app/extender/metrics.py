"""Prometheus metrics of one extender, in its own registry (so tests and several apps never collide).

===============================================  ==============================================================
rtt_extender_request_seconds{verb}               latency histogram per verb (filter, prioritize, ...)
rtt_extender_requests_total{verb,code}           answers by HTTP status
rtt_extender_stale_answers_total{reason}         neutral answers for lack of fresh data
rtt_extender_unlabeled_pods_total{verb}          pods without the app label (neutral, not ours)
rtt_extender_scored_pods_total{app}              pods scored by prioritize with predictions
rtt_extender_single_node_placements_total{app}   pods a filter left one node for: assumed there (no prioritize)
rtt_extender_failed_nodes_total{reason}          candidates the filter rejected (anti_affinity, sla)
rtt_extender_sla_relaxed_total{app}              SLA would have rejected every candidate: all passed
rtt_extender_predictions_published_total         rtt-predictions messages the broker acknowledged
rtt_extender_predictions_dropped_total           ... dropped (queue full or send failed)
rtt_extender_feed_messages_total{topic,result}   view messages applied / ignored / rejected
rtt_extender_model_loads_total{result}           model blobs loaded / failed
rtt_extender_snapshot_age_seconds                age of the newest node-features in the view
rtt_extender_snapshot_nodes, _models             size of the current view
rtt_extender_errors_total                        unexpected errors answered with 500
rtt_extender_connections                         open client connections
rtt_extender_connections_rejected_total          connections refused (503) beyond the connection cap
rtt_contract_unknown_fields_total{topic,field}   fields a newer release added, ignored (app.contracts.unknown)
===============================================  ==============================================================

Label values are bounded: ``verb`` is a route name (or ``other``), ``code`` an HTTP status, and ``app`` one of
the apps the extender knows (:class:`AppLabels`: apps in the policy or with a model; every other label value a
pod may carry is counted as ``other``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from app.contracts.unknown import register_unknown_fields

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
DELAY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ExtenderMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.request_seconds = Histogram("rtt_extender_request_seconds", "Request latency per verb", ["verb"],
                                         buckets=LATENCY_BUCKETS, registry=r)
        self.requests = Counter("rtt_extender_requests_total", "Answers by verb and HTTP status",
                                ["verb", "code"], registry=r)
        self.stale_answers = Counter("rtt_extender_stale_answers_total",
                                     "Neutral answers for lack of fresh data", ["reason"], registry=r)
        self.candidates = Counter("rtt_extender_candidates_total",
                                  "Candidate nodes of labeled pods, per filter and prioritize request", registry=r)
        self.stale_candidates = Counter("rtt_extender_stale_candidates_total",
                                        "Candidates scored neutral for stale data (a whole neutral answer's too)",
                                        registry=r)
        self.unlabeled_pods = Counter("rtt_extender_unlabeled_pods_total", "Pods without the app label",
                                      ["verb"], registry=r)
        self.scored_pods = Counter("rtt_extender_scored_pods_total", "Pods scored with predictions", ["app"],
                                   registry=r)
        self.single_node = Counter("rtt_extender_single_node_placements_total",
                                   "Pods a filter left one node for, assumed there", ["app"], registry=r)
        self.failed_nodes = Counter("rtt_extender_failed_nodes_total", "Candidates rejected by the filter",
                                    ["reason"], registry=r)
        self.sla_relaxed = Counter("rtt_extender_sla_relaxed_total", "SLA rejected every candidate: all passed",
                                   ["app"], registry=r)
        self.published = Counter("rtt_extender_predictions_published_total", "rtt-predictions the broker"
                                 " acknowledged", registry=r)
        self.dropped = Counter("rtt_extender_predictions_dropped_total", "rtt-predictions dropped", registry=r)
        self.feed_messages = Counter("rtt_extender_feed_messages_total", "View messages by topic and result",
                                     ["topic", "result"], registry=r)
        self.feed_delay = Histogram("rtt_extender_feed_delay_seconds",
                                    "Age of the newest record of each partition in a fetch when the view reads it"
                                    " (record timestamp to now; large while catching up at start)", ["topic"],
                                    buckets=DELAY_BUCKETS, registry=r)
        self.model_loads = Counter("rtt_extender_model_loads_total", "Model loads by result", ["result"],
                                   registry=r)
        self.errors = Counter("rtt_extender_errors_total", "Unexpected errors answered with 500", registry=r)
        self.snapshot_age = Gauge("rtt_extender_snapshot_age_seconds", "Age of the newest node-features",
                                  registry=r)
        self.snapshot_nodes = Gauge("rtt_extender_snapshot_nodes", "Nodes in the current view", registry=r)
        self.snapshot_models = Gauge("rtt_extender_snapshot_models", "Models in the current view", registry=r)
        self.connections = Gauge("rtt_extender_connections", "Open client connections", registry=r)
        self.connections_rejected = Counter("rtt_extender_connections_rejected_total",
                                            "Connections refused beyond the connection cap", registry=r)
        register_unknown_fields(r)

    def track_snapshot_age(self, age: Callable[[], float]) -> None:
        """Report ``age()`` at scrape time (-1 while there is no data)."""
        self.snapshot_age.set_function(lambda: (lambda a: -1.0 if math.isinf(a) else a)(age()))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class Children:
    """``metric.labels(*values)`` kept per tuple of values (a lookup instead of the client's checks and lock on
    every request); only for label values that are bounded (verbs, statuses, :class:`AppLabels`).

    >>> c = Counter("demo_total", "demo", ["verb"], registry=CollectorRegistry())
    >>> child = Children(c)
    >>> child("filter").inc(); child("filter") is child("filter"), c.labels("filter")._value.get()
    (True, 1.0)
    """

    def __init__(self, metric: Counter | Histogram | Gauge) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


class AppLabels:
    """The ``app`` label value of a pod's app: itself when known, else ``other`` (pod labels are unbounded).

    >>> labels = AppLabels(["gCTF"])
    >>> labels.of("gCTF"), labels.of("my-app-4711")
    ('gCTF', 'other')
    >>> labels.update(["upload"]); labels.of("upload")
    'upload'
    """

    OTHER = "other"

    def __init__(self, known: Iterable[str] = (), limit: int = 256) -> None:
        self._limit = limit
        self._known: set[str] = set()
        self.update(known)

    def update(self, apps: Iterable[str]) -> None:
        """Also know ``apps`` (up to ``limit`` apps in all)."""
        for app in apps:
            if len(self._known) >= self._limit:
                break
            self._known.add(app)

    def of(self, app: str) -> str:
        return app if app in self._known else self.OTHER
