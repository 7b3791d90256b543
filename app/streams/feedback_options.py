"""Options of the feedback loop, read from their :class:`~app.config.Settings` fields (``RTT_COLD_START_SAMPLES``,
``RTT_DRIFT_*``, ``RTT_JOIN_MAX_ENTRIES``, ``RTT_JOIN_PREDICTION_WAIT_S``, ``RTT_FEEDBACK_REDIS_TIMEOUT_S``,
``RTT_RETRAIN_GROWTH``); a bad value is a :class:`~app.errors.ConfigError` naming the variable.

>>> FeedbackOptions.from_settings(Settings.from_env({"RTT_COLD_START_SAMPLES": "50"})).cold_start_samples
50
>>> FeedbackOptions(drift_threshold=0)
Traceback (most recent call last):
...
app.errors.ConfigError: RTT_DRIFT_THRESHOLD: must be > 0 (got 0)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from app.config import Settings
from app.drift import pagehinkley
from app.errors import ConfigError

_ENV = {
    "cold_start_samples": "RTT_COLD_START_SAMPLES",
    "drift_threshold": "RTT_DRIFT_THRESHOLD",
    "drift_delta": "RTT_DRIFT_DELTA",
    "drift_min_instances": "RTT_DRIFT_MIN_INSTANCES",
    "drift_jump": "RTT_DRIFT_JUMP",
    "join_max_entries": "RTT_JOIN_MAX_ENTRIES",
    "join_prediction_wait_s": "RTT_JOIN_PREDICTION_WAIT_S",
    "feedback_redis_timeout_s": "RTT_FEEDBACK_REDIS_TIMEOUT_S",
    "retrain_growth": "RTT_RETRAIN_GROWTH",
}
_COUNTS = {"cold_start_samples", "drift_min_instances", "join_max_entries"}
_NON_NEGATIVE = {"drift_delta", "retrain_growth", "drift_jump", "join_prediction_wait_s"}


@dataclasses.dataclass(frozen=True)
class FeedbackOptions:
    cold_start_samples: int = 25
    """Samples of a model key (seen by this worker) that trigger a cold-start retrain when it has no model."""
    drift_threshold: float = pagehinkley.THRESHOLD
    """Page-Hinkley threshold on the cumulative excess of per-period MAPE (docs/feedback.md)."""
    drift_delta: float = pagehinkley.DELTA
    """Page-Hinkley tolerated MAPE increase."""
    drift_min_instances: int = pagehinkley.MIN_INSTANCES
    """Periods with completions before a node × app may signal a drift."""
    drift_jump: float = pagehinkley.JUMP
    """One-period MAPE excess over the reference that is a drift at once (level-shift rule); 0: off."""
    join_max_entries: int = 500_000
    """Keys the join buffer of one worker holds at most (the oldest leave early, counted as expired)."""
    join_prediction_wait_s: float = 5.0
    """Longest an ``ok`` completion read before its prediction waits for it (held with its join entry) before its
    training sample goes out without it; 0: no wait."""
    feedback_redis_timeout_s: float = 1.0
    """Longest a batched Redis write may take before it is abandoned (the next period writes again)."""
    retrain_growth: float = 0.5
    """A key with a model is retrained when its samples grew by this fraction since the last ask (0: never)."""

    def __post_init__(self) -> None:
        checks = {
            "cold_start_samples": self.cold_start_samples >= 1, "drift_threshold": self.drift_threshold > 0,
            "drift_delta": self.drift_delta >= 0, "drift_min_instances": self.drift_min_instances >= 1,
            "join_max_entries": self.join_max_entries >= 1,
            "join_prediction_wait_s": 0 <= self.join_prediction_wait_s < math.inf,
            "feedback_redis_timeout_s": self.feedback_redis_timeout_s > 0,
            "retrain_growth": self.retrain_growth >= 0,
            "drift_jump": self.drift_jump >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                bound = ">= 0" if name in _NON_NEGATIVE else ">= 1" if name in _COUNTS else "> 0"
                raise ConfigError(_ENV[name], f"must be {bound} (got {getattr(self, name)})")

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> FeedbackOptions:
        values: dict[str, Any] = {f.name: getattr(settings, f.name) for f in dataclasses.fields(cls)}
        values["join_prediction_wait_s"] = float(values["join_prediction_wait_s"])  # a plain float, not DefaultWait
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
