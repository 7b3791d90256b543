"""Prometheus metrics of the feedback loop (served on the worker's ``/metrics`` page).

The Grafana dashboard reads ``rtt_worker_prediction_rmse_ms``, ``rtt_worker_prediction_mape`` and
``rtt_worker_node_weight`` by these names. Join outcomes: ``matched`` (a prediction met its completion),
``expired`` (a prediction whose task ran elsewhere or never finished within the TTL), ``duplicate``
(an at-least-once redelivery, counted once), ``no_prediction`` (a completion nothing predicted).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

JOIN = Counter("rtt_worker_join_total", "Join of task-completions with rtt-predictions, by outcome", ["outcome"])
PREDICTION_RMSE = Gauge("rtt_worker_prediction_rmse_ms", "RMSE of the last error period", ["app", "node_class"])
PREDICTION_MAPE = Gauge("rtt_worker_prediction_mape", "MAPE (fraction) of the last error period",
                        ["app", "node_class"])
NODE_WEIGHT = Gauge("rtt_worker_node_weight", "Credibility of a node's predictions (0..1)", ["node"])
RETRAIN_EVENTS = Counter("rtt_worker_retrain_events_total", "retrain-events emitted, by reason", ["reason"])
RETRAIN_DEBOUNCED = Counter("rtt_worker_retrain_debounced_total", "Drift signals inside the debounce interval",
                            ["reason"])
MODEL_VERSION = Gauge("rtt_worker_model_version", "Model version the worker predicts with", ["model_key"])
MODEL_REJECTED = Counter("rtt_worker_model_rejected_total", "model-updates that could not be loaded, by reason",
                         ["reason"])
SAMPLES = Counter("rtt_worker_training_samples_total", "training-samples emitted")
SAMPLES_DROPPED = Counter("rtt_worker_training_samples_dropped_total", "Completions that made no sample",
                          ["reason"])
JOIN_ENTRIES = Gauge("rtt_worker_join_entries", "Keys held by this worker's join buffer")
REDIS_WRITES = Counter("rtt_worker_redis_writes_total", "Batched Redis cache writes, by outcome", ["outcome"])
MODEL_RETRIES = Counter("rtt_worker_model_load_retries_total",
                        "model-updates whose model could not be loaded because the registry was unavailable (retried)")
