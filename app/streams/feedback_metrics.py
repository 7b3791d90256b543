"""Prometheus metrics of the feedback loop (served on the worker's ``/metrics`` page, from its app's registry).

The Grafana dashboard reads ``rtt_worker_prediction_rmse_ms``, ``rtt_worker_prediction_mape`` and
``rtt_worker_node_weight`` by these names. Join outcomes: ``matched`` (a prediction met its completion),
``expired`` (a prediction whose task ran elsewhere or never finished within the TTL), ``duplicate``
(an at-least-once redelivery, counted once), ``no_prediction`` (a completion nothing predicted).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class FeedbackMetrics:
    """The feedback loop's series, registered in ``registry`` (the worker app's, beside its other series)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.join = Counter("rtt_worker_join_total", "Join of task-completions with rtt-predictions, by outcome",
                            ["outcome"], registry=r)
        self.prediction_rmse = Gauge("rtt_worker_prediction_rmse_ms", "RMSE of the last error period",
                                     ["app", "node_class"], registry=r)
        self.prediction_mape = Gauge("rtt_worker_prediction_mape", "MAPE (fraction) of the last error period",
                                     ["app", "node_class"], registry=r)
        self.node_weight = Gauge("rtt_worker_node_weight", "Credibility of a node's predictions (0..1)", ["node"],
                                 registry=r)
        self.retrain_events = Counter("rtt_worker_retrain_events_total", "retrain-events emitted, by reason",
                                      ["reason"], registry=r)
        self.retrain_debounced = Counter("rtt_worker_retrain_debounced_total",
                                         "Drift signals inside the debounce interval", ["reason"], registry=r)
        self.model_version = Gauge("rtt_worker_model_version", "Model version the worker predicts with",
                                   ["model_key"], registry=r)
        self.model_rejected = Counter("rtt_worker_model_rejected_total",
                                      "model-updates that could not be loaded, by reason", ["reason"], registry=r)
        self.samples = Counter("rtt_worker_training_samples_total", "training-samples the broker acknowledged",
                               registry=r)
        self.samples_dropped = Counter("rtt_worker_training_samples_dropped_total", "Completions that made no sample",
                                       ["reason"], registry=r)
        self.samples_without_prediction = Counter(
            "rtt_worker_training_samples_without_prediction", "Training samples made with no prediction of their task"
            " (none read within RTT_JOIN_PREDICTION_WAIT_S of its completion)", registry=r)
        self.samples_held = Gauge("rtt_worker_training_samples_held", "Completions waiting for their node's class"
                                  " (its metrics not read yet) before their sample is made", registry=r)
        self.join_entries = Gauge("rtt_worker_join_entries", "Keys held by this worker's join buffer", registry=r)
        self.redis_writes = Counter("rtt_worker_redis_writes_total", "Batched Redis cache writes, by outcome",
                                    ["outcome"], registry=r)
        self.model_retries = Counter("rtt_worker_model_load_retries_total", "model-updates whose model could not be"
                                     " loaded because the registry was unavailable (retried)", registry=r)
