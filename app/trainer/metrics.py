"""Prometheus metrics of the trainer, on a registry of their own (tests build as many as they like)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from app.contracts.unknown import register_unknown_fields

OUTCOMES = ("promoted", "rejected", "failed", "insufficient_data")
MODEL_STORE = "model_store"  # the degraded reason of a retrain waiting for the registry, or a check not reaching it
UNREADABLE = "registry_unreadable"  # the degraded reason while the registry check cannot read a key's record
KAFKA = "kafka"  # the degraded reason while the broker does not answer (as rtt_extender_degraded's)
TRAINING_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
PROMOTION_BUCKETS_S = (5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


class TrainerMetrics:
    """The trainer's series.

    * ``rtt_trainer_retrains_total{reason, outcome}``: retrains by event reason and outcome
      (``promoted | rejected | failed | insufficient_data``);
    * ``rtt_trainer_events_coalesced_total``: events dropped because their key was already training;
    * ``rtt_trainer_drift_to_promotion_seconds``: from the event's ``onset_ts`` (the detector's estimate
      of when the error began to rise; the event's ``ts`` without one) to the model-updates message;
    * ``rtt_trainer_model_version{model_key}``: newest version announced on model-updates (by this trainer, a
      replica or ``rttsched models rollback``);
    * ``rtt_trainer_training_seconds``: feature selection + training + validation, wall time;
    * ``rtt_trainer_samples``: samples held in the history, all keys;
    * ``rtt_trainer_key_samples_total{model_key}``: new samples per key (their rate: what a retrain will have);
    * ``rtt_trainer_history_bytes``: bytes of their feature rows;
    * ``rtt_trainer_keys_dropped_total``: keys whose history was dropped after ``RTT_TRAINER_KEY_IDLE_S``
      without a sample;
    * ``rtt_trainer_keys``: model keys whose history is held (at most ``RTT_TRAINER_MAX_KEYS``; a sample of a new
      key beyond it is ``rtt_trainer_bad_messages_total{reason="model_keys_full"}``);
    * ``rtt_trainer_keys_evicted_total``: keys without a model whose history was dropped to make room for a key
      with one, the trainer holding ``RTT_TRAINER_MAX_KEYS``;
    * ``rtt_trainer_retrain_retries_total{step}``: retrain steps tried again (``registry``: the model registry
      could not be read or written — Redis away, a models directory full, read-only or gone; ``announce``:
      Kafka did not acknowledge the model-updates message);
    * ``rtt_trainer_degraded{reason}``: 1 while the trainer runs without a dependency, else 0 (``model_store``:
      a retrain waits for the model registry, or the registry check cannot reach it; ``registry_unreadable``: the
      last registry check could not read a key's record, :mod:`app.trainer.agreement`; ``kafka``: the broker did not
      answer the last look for its metadata), as ``rtt_worker_degraded`` and ``rtt_extender_degraded``.

    >>> m = TrainerMetrics()
    >>> m.retrains.labels(reason="drift", outcome="promoted").inc()
    >>> m.registry.get_sample_value("rtt_trainer_retrains_total", {"reason": "drift", "outcome": "promoted"})
    1.0
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        register_unknown_fields(self.registry)  # rtt_contract_unknown_fields_total: fields a newer release added
        self.retrains = Counter("rtt_trainer_retrains", "Retrains by event reason and outcome",
                                ["reason", "outcome"], registry=self.registry)
        self.coalesced = Counter("rtt_trainer_events_coalesced", "Retrain events dropped: key already training",
                                 registry=self.registry)
        self.bad_messages = Counter("rtt_trainer_bad_messages", "Messages that broke their contract",
                                    ["topic", "reason"], registry=self.registry)
        self.dead_letters = Counter("rtt_trainer_dead_letters", "Bad messages stored on dead-letters (each once)",
                                    ["topic", "reason"], registry=self.registry)
        self.drift_to_promotion = Histogram("rtt_trainer_drift_to_promotion_seconds",
                                            "Drift onset to model-updates announcement",
                                            buckets=PROMOTION_BUCKETS_S, registry=self.registry)
        self.model_version = Gauge("rtt_trainer_model_version", "Newest version announced", ["model_key"],
                                   registry=self.registry)
        self.training_seconds = Histogram("rtt_trainer_training_seconds", "Selection + training + validation",
                                          buckets=TRAINING_BUCKETS_S, registry=self.registry)
        self.samples = Gauge("rtt_trainer_samples", "Training samples held in memory", registry=self.registry)
        self.key_samples = Counter("rtt_trainer_key_samples", "New training samples by model key (a key's series"
                                   " goes with its history)", ["model_key"], registry=self.registry)
        self.history_bytes = Gauge("rtt_trainer_history_bytes", "Bytes of the feature rows of the sample history",
                                   registry=self.registry)
        self.keys_dropped = Counter("rtt_trainer_keys_dropped", "Model keys whose sample history was dropped:"
                                    " no sample for RTT_TRAINER_KEY_IDLE_S", registry=self.registry)
        self.keys = Gauge("rtt_trainer_keys", "Model keys whose sample history is held (RTT_TRAINER_MAX_KEYS at most)",
                          registry=self.registry)
        self.keys_evicted = Counter("rtt_trainer_keys_evicted", "Model keys without a model whose sample history was"
                                    " dropped for a key with one, at RTT_TRAINER_MAX_KEYS", registry=self.registry)
        self.duplicates = Counter("rtt_trainer_duplicate_samples", "Training samples of a task already held",
                                  registry=self.registry)
        self.retries = Counter("rtt_trainer_retrain_retries", "Retrain steps tried again because the model"
                               " registry (Redis, the models directory) or Kafka was unavailable", ["step"],
                               registry=self.registry)
        self.degraded = Gauge("rtt_trainer_degraded", "1 while the trainer runs without a dependency (by reason),"
                              " else 0", ["reason"], registry=self.registry)
        self.degraded.labels(MODEL_STORE).set(0)
        self.degraded.labels(UNREADABLE).set(0)
        self.degraded.labels(KAFKA).set(0)
