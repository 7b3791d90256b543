"""Worker options that are not (yet) fields of :class:`~app.config.Settings`, with their defaults.

Each is read from ``Settings`` when it has the field (``RTT_WORKER_SESSION_TIMEOUT_S``,
``RTT_FEATURE_HISTORY_S``, ``RTT_FEATURE_BUCKET_S``, ``RTT_FEATURE_MAX_METRICS``, ``RTT_WORKER_DATADIR``,
``RTT_WORKER_CHECKPOINT_INTERVAL_S``),
else from the constructor, else the default below.

>>> WorkerOptions.from_settings(Settings(), history_s=90.0).history_s
90.0
>>> WorkerOptions(history_s=2.0)
Traceback (most recent call last):
...
app.errors.ConfigError: RTT_FEATURE_HISTORY_S: must be >= RTT_DWA_MAX_WINDOW_S (60.0) (got 2.0)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from app.config import Settings
from app.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class WorkerOptions:
    session_timeout_s: float = 10.0
    """Kafka group session timeout (Faust ``broker_session_timeout``); 10 s makes the first join fast."""
    history_s: float = 120.0
    """How far back per-node buckets are kept: bounds memory and event-time lookups."""
    bucket_s: float = 1.0
    """Resolution of window edges."""
    max_metrics: int = 256
    """Distinct metric names kept per node."""
    datadir: str = "var/faust"
    """Faust's data directory (the memory store writes nothing there but Faust creates it)."""
    checkpoint_interval_s: float = 1.0
    """How often changed node state is written to the changelogged table (what a restart loses at most)."""
    max_window_s: float = 60.0
    request_timeout_ms: int = 40_000
    """How long the intakes' producer tries a batch before it fails it (aiokafka's ``request_timeout_ms``): a
    failed batch is kept and sent again (:class:`~app.kafka.batches.BatchSender`)."""

    def __post_init__(self) -> None:
        if not self.session_timeout_s > 0:
            raise ConfigError("RTT_WORKER_SESSION_TIMEOUT_S", f"must be > 0 (got {self.session_timeout_s})")
        if not self.bucket_s > 0:
            raise ConfigError("RTT_FEATURE_BUCKET_S", f"must be > 0 (got {self.bucket_s})")
        if not self.history_s >= self.max_window_s:
            raise ConfigError("RTT_FEATURE_HISTORY_S",
                              f"must be >= RTT_DWA_MAX_WINDOW_S ({self.max_window_s}) (got {self.history_s})")
        if not self.bucket_s <= self.history_s:  # a window holds at least one bucket
            raise ConfigError("RTT_FEATURE_BUCKET_S",
                              f"must be <= RTT_FEATURE_HISTORY_S ({self.history_s}) (got {self.bucket_s})")
        if not self.checkpoint_interval_s > 0:
            raise ConfigError("RTT_WORKER_CHECKPOINT_INTERVAL_S", f"must be > 0 (got {self.checkpoint_interval_s})")
        if self.request_timeout_ms < 1:
            raise ValueError(f"request_timeout_ms must be >= 1 (got {self.request_timeout_ms})")
        if self.max_metrics < 1:
            raise ConfigError("RTT_FEATURE_MAX_METRICS", f"must be >= 1 (got {self.max_metrics})")

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> WorkerOptions:
        values: dict[str, Any] = {"max_window_s": max(settings.dwa_max_window_s, settings.feature_window_s)}
        for opt, field in (("session_timeout_s", "worker_session_timeout_s"), ("history_s", "feature_history_s"),
                           ("bucket_s", "feature_bucket_s"), ("max_metrics", "feature_max_metrics"),
                           ("datadir", "worker_datadir"), ("checkpoint_interval_s", "worker_checkpoint_interval_s")):
            if hasattr(settings, field):
                values[opt] = getattr(settings, field)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
