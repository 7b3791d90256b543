"""Prometheus metrics of the worker, and the ``/metrics`` page on Faust's web server.

Metrics live in the process's default registry (one worker app per process); a second app built in
the same process (tests) shares them.
"""

from __future__ import annotations

from typing import Any

import faust
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

MESSAGES_IN = Counter("rtt_worker_messages_in_total", "Messages consumed, by topic", ["topic"])
MESSAGES_OUT = Counter("rtt_worker_messages_out_total", "Messages produced, by topic", ["topic"])
DEAD_LETTERS = Counter("rtt_worker_dead_letters_total", "Messages sent to dead-letters", ["topic", "reason"])
LATE_EVENTS = Counter("rtt_worker_late_events_total", "Events older than the kept history, dropped", ["topic"])
PROCESSING = Histogram(
    "rtt_worker_processing_seconds", "Time to process one message, by agent", ["agent"],
    buckets=(5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 0.025, 0.1),
)
EVENT_AGE = Histogram(
    "rtt_worker_event_age_seconds", "Message ts to processing (lag, with the producers' clock skew)", ["topic"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
INTAKE_LAG = Gauge("rtt_worker_intake_lag_messages",
                   "Messages not yet read by the worker's intakes (high watermark - read position)",
                   ["topic", "partition"])
NODES = Gauge("rtt_worker_nodes", "Nodes whose window this worker holds")
FEATURES_EMITTED = Counter("rtt_worker_node_features_emitted_total", "node-features messages emitted")
CLOCK_RESETS = Counter("rtt_worker_clock_resets_total",
                       "Node windows started afresh because the node's clock went back (docs/worker.md)")
EVICTED = Counter("rtt_worker_evicted_total", "Nodes and apps dropped after RTT_NODE_EVICT_AFTER_S of silence",
                  ["kind"])


def register_metrics_page(app: faust.App, path: str = "/metrics") -> None:
    """Serve the Prometheus exposition at ``path`` on the app's web server (when web is enabled)."""

    @app.page(path)
    async def metrics_page(web: Any, request: Any) -> Any:
        return web.bytes(generate_latest(), content_type=CONTENT_TYPE_LATEST.split(";")[0])
