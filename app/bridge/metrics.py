"""The bridge's own Prometheus metrics (served on ``RTT_METRICS_PORT`` when it is > 0).

``rtt_bridge_scrapes_total{node, url, result}``            scrapes per endpoint, result ``ok`` | ``failed``
``rtt_bridge_exporter_trouble_total{node, exporter, kind}`` exporter trouble (see :mod:`app.bridge.health`)
``rtt_bridge_samples_dropped_total{exporter}``              blank sentinels and non-finite samples dropped
``rtt_bridge_values_clamped_total{metric}``                 readings slightly out of range, clamped to it
``rtt_bridge_values_rejected_total{metric}``                readings far out of range, left out
``rtt_bridge_intervals_skipped_total{node, url, reason}``   intervals between two pages of an endpoint whose
                                                            counters gave no rates: ``clock_jump``,
                                                            ``host_changed`` (a page of another host),
                                                            ``counter_bounce`` (counters back and forth);
                                                            ``counter_reset``: some series only
``rtt_bridge_scrapes_late_total{node, url}``               rounds at whose end this endpoint's scrape of the node
                                                            was still under way (a slow or hung exporter; it is not
                                                            scraped again while it is, and goes out in a later
                                                            round)
``rtt_bridge_ticks_skipped_total``                          scrape ticks skipped because a round overran the
                                                            interval (a slow publish: Kafka)
``rtt_bridge_scrape_duration_seconds``                      one endpoint's scrape (HTTP + body), histogram
``rtt_bridge_messages_total{topic}``                        messages produced
``rtt_bridge_records_skipped_total{source, reason}``        input records not turned into messages
                                                            (spans that are no task, invalid lines ...)
``rtt_bridge_span_node_fallbacks_total{attribute}``         task spans whose node came from ``host.name``
                                                            (in Kubernetes the pod's name, not the node's)

Each :class:`BridgeMetrics` has a registry of its own (the process makes one and serves it; tests make as many
as they like), never the process-wide default.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from app.health import Heartbeat, serve_health

log = logging.getLogger(__name__)

SCRAPE_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class BridgeMetrics:
    """The bridge's counters and histograms, registered in ``registry`` (a fresh one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.registry = reg
        self.scrapes = Counter("rtt_bridge_scrapes", "Exporter scrapes by endpoint and result",
                               ["node", "url", "result"], registry=reg)
        self.trouble = Counter("rtt_bridge_exporter_trouble", "Exporter trouble that withheld metrics",
                               ["node", "exporter", "kind"], registry=reg)
        self.dropped = Counter("rtt_bridge_samples_dropped", "Blank or non-finite exporter samples dropped",
                               ["exporter"], registry=reg)
        self.clamped = Counter("rtt_bridge_values_clamped", "Readings slightly out of range, clamped to it",
                               ["metric"], registry=reg)
        self.rejected = Counter("rtt_bridge_values_rejected", "Readings far out of range, left out",
                                ["metric"], registry=reg)
        self.intervals_skipped = Counter("rtt_bridge_intervals_skipped",
                                         "Intervals of an endpoint whose counters gave no rates, by reason",
                                         ["node", "url", "reason"], registry=reg)
        self.late = Counter("rtt_bridge_scrapes_late", "Rounds at whose end this endpoint's scrape of the node was "
                            "still under way (published in a later round)", ["node", "url"], registry=reg)
        self.ticks_skipped = Counter("rtt_bridge_ticks_skipped", "Scrape ticks skipped because a round overran the "
                                     "interval", registry=reg)
        self.node_fallbacks = Counter("rtt_bridge_span_node_fallbacks", "Task spans whose node came from a"
                                      " fallback attribute", ["attribute"], registry=reg)
        self.scrape_seconds = Histogram("rtt_bridge_scrape_duration_seconds", "Duration of one endpoint scrape",
                                        buckets=SCRAPE_BUCKETS_S, registry=reg)
        self.messages = Counter("rtt_bridge_messages", "Messages produced", ["topic"], registry=reg)
        self.skipped = Counter("rtt_bridge_records_skipped", "Input records not turned into messages",
                               ["source", "reason"], registry=reg)
        self.node_gpu = Gauge("rtt_bridge_node_gpu", "1 while the node's messages say class gpu (a GPU exporter "
                              "answered, or its target says so), 0 while they say cpu", ["node"], registry=reg)
        self.unpublished = Counter("rtt_bridge_rounds_unpublished",
                                   "Scrape rounds whose messages the broker did not take (Kafka away): dropped",
                                   ["topic"], registry=reg)

    def value(self, name: str, **labels: str) -> float:
        """Current value of a sample (0 when absent), e.g. ``value("rtt_bridge_messages_total", topic=...)``."""
        v = self.registry.get_sample_value(name, labels)
        return 0.0 if v is None else v


def serve_metrics(metrics: BridgeMetrics, port: int, addr: str = "0.0.0.0") -> Heartbeat | None:  # noqa: S104 - scraped from other pods
    """Serve ``metrics`` as ``/metrics``, and ``/healthz``, on ``port`` in a background thread; nothing (None)
    when ``port`` is 0. ``/healthz`` fails while the returned heartbeat does not beat on the bridge's event loop
    (:func:`app.health.beating`). A port that is taken (an address not this host's) is a
    :class:`~app.errors.ConfigError` naming ``RTT_METRICS_PORT``."""
    heartbeat = serve_health(port, addr, metrics.registry)
    if heartbeat is not None:
        log.info("serving /metrics and /healthz on %s:%d", addr, port)
    return heartbeat
