"""Prometheus metrics of the worker, on the registry of its app, and the ``/metrics`` page that serves them.

:func:`~app.streams.app.create_app` makes one registry per app (:class:`WorkerMetrics`, on the app's
:class:`~app.streams.context.WorkerContext`), so two apps in one process (tests) count apart, and the page
serves only its own app's series. The feedback loop's series are :mod:`app.streams.feedback_metrics`, on
the same registry, and so is ``rtt_contract_unknown_fields_total{topic, field}`` (the process's count of the
fields a newer release added that the intakes ignored: :mod:`app.contracts.unknown`).

>>> m = WorkerMetrics()
>>> m.messages_in.labels("node-metrics").inc(3)
>>> m.value("rtt_worker_messages_in_total", topic="node-metrics")
3.0
"""

from __future__ import annotations

from typing import Any

import faust
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from app.contracts.unknown import register_unknown_fields
from app.streams.feedback_metrics import FeedbackMetrics

PROCESSING_BUCKETS_S = (5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 0.025, 0.1)
EVENT_AGE_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class WorkerMetrics:
    """The worker's series, registered in ``registry`` (a fresh one by default); ``feedback``: the loop's."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.messages_in = Counter("rtt_worker_messages_in_total", "Messages consumed, by topic (counted once a"
                                   " stored checkpoint holds them)", ["topic"], registry=r)
        self.messages_out = Counter("rtt_worker_messages_out_total", "Messages produced (acknowledged by the"
                                    " broker), by topic", ["topic"], registry=r)
        self.send_failures = Counter("rtt_worker_send_failures_total", "Messages the broker did not acknowledge,"
                                     " by topic and outcome (retried: sent again; dropped: not)", ["topic", "outcome"],
                                     registry=r)
        self.dead_letters = Counter("rtt_worker_dead_letters_total", "Messages sent to dead-letters",
                                    ["topic", "reason"], registry=r)
        self.revoke_failures = Counter(
            "rtt_worker_revoke_checkpoint_failures_total",
            "Partitions revoked whose last checkpoint was not stored (the broker away): their state left memory"
            " all the same, and their new owner reads again from the last stored checkpoint, by table",
            ["table"], registry=r)
        self.late_events = Counter("rtt_worker_late_events_total", "Events older than the kept history, dropped",
                                   ["topic"], registry=r)
        self.processing = Histogram("rtt_worker_processing_seconds", "Time to process one message, by agent",
                                    ["agent"], buckets=PROCESSING_BUCKETS_S, registry=r)
        self.event_age = Histogram("rtt_worker_event_age_seconds",
                                   "Message ts to processing (lag, with the producers' clock skew)", ["topic"],
                                   buckets=EVENT_AGE_BUCKETS_S, registry=r)
        self.intake_lag = Gauge("rtt_worker_intake_lag_messages",
                                "Messages not yet read by the worker's intakes (high watermark - read position)",
                                ["topic", "partition"], registry=r)
        self.nodes = Gauge("rtt_worker_nodes", "Nodes whose window this worker holds", registry=r)
        self.features_emitted = Counter("rtt_worker_node_features_emitted_total", "node-features messages the broker"
                                        " acknowledged", registry=r)
        self.clock_resets = Counter("rtt_worker_clock_resets_total",
                                    "Node windows started afresh because the node's clock went back (docs/worker.md)",
                                    registry=r)
        self.evicted = Counter("rtt_worker_evicted_total",
                               "Nodes and apps dropped after RTT_NODE_EVICT_AFTER_S of silence", ["kind"], registry=r)
        self.changelog_rewinds = Counter("rtt_worker_changelog_rewinds_total",
                                         "Changelog partitions found recreated under the worker (the broker lost its"
                                         " data): the state kept of them is written again", ["table"], registry=r)
        self.changelog_rewrite_failures = Counter(
            "rtt_worker_changelog_rewrite_failures_total", "Changelog partitions found recreated by the recovery whose"
            " state could not be marked to be written again (logged at ERROR; the worker goes on)", ["table"],
            registry=r)
        self.timer_failures = Counter("rtt_worker_timer_failures_total",
                                      "Timer ticks that failed (logged; the next tick runs), by timer", ["timer"],
                                      registry=r)
        self.feedback = FeedbackMetrics(r)
        register_unknown_fields(r)

    def value(self, name: str, **labels: str) -> float:
        """Current value of a sample (0 when absent)."""
        v = self.registry.get_sample_value(name, labels)
        return 0.0 if v is None else v

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)


def register_metrics_page(app: faust.App, metrics: WorkerMetrics, path: str = "/metrics") -> None:
    """Serve ``metrics`` in the Prometheus exposition at ``path`` on the app's web server (when web is enabled)."""

    @app.page(path)
    async def metrics_page(web: Any, request: Any) -> Any:
        return web.bytes(metrics.exposition(), content_type=CONTENT_TYPE_LATEST.split(";")[0])
