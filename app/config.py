"""One frozen settings object, read from the environment and validated at start.

Every field has an environment variable (``RTT_<FIELD>`` unless noted). A bad value fails at
start with a :class:`~app.errors.ConfigError` naming the variable, never later and never silently
replaced by a default.

>>> s = Settings.from_env({"RTT_FEATURE_WINDOW_S": "20"})
>>> s.feature_window_s
20.0
>>> Settings.from_env({"RTT_FEATURE_WINDOW_S": "-1"})
Traceback (most recent call last):
...
app.errors.ConfigError: RTT_FEATURE_WINDOW_S: must be > 0 (got -1.0)
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from app.errors import ConfigError

EMBEDDED_BROKER_PORT = 9092


def _env_name(field: dataclasses.Field[Any]) -> str:
    return str(field.metadata.get("env", f"RTT_{field.name.upper()}"))


def _positive(v: float) -> str | None:
    return None if v > 0 else f"must be > 0 (got {v})"


def _non_negative(v: float) -> str | None:
    return None if v >= 0 else f"must be >= 0 (got {v})"


def _port(v: int) -> str | None:
    return None if 0 <= v <= 65535 else f"must be a port between 0 and 65535 (got {v})"


def _fraction(v: float) -> str | None:
    return None if 0.0 <= v <= 1.0 else f"must be between 0 and 1 (got {v})"


def _f(default: Any, check: Callable[[Any], str | None] | None = None, env: str | None = None,
       doc: str = "") -> Any:
    meta: dict[str, Any] = {"check": check, "doc": doc}
    if env:
        meta["env"] = env
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class Settings:
    # -- connections
    kafka_bootstrap: str = _f("", env="RTT_KAFKA_BOOTSTRAP",
                              doc="host:port[,host:port]; empty = embedded broker on 127.0.0.1:9092")
    redis_url: str = _f("", env="REDIS_URL", doc="redis://host:port/db; empty = local directory registry")
    topic_prefix: str = _f("", doc="prefix for every topic name (tests use a uuid)")
    models_dir: str = _f("var/models", doc="model registry directory when no Redis is configured")
    metrics_port: int = _f(0, _port, doc="Prometheus /metrics port of this process; 0 = none")
    # -- bridge
    scrape_interval_s: float = _f(1.0, _positive, doc="exporter scrape interval")
    scrape_timeout_s: float = _f(2.0, _positive, doc="bound on one exporter scrape (a slower one counts as failed)")
    bridge_gpu_apps: str = _f("", doc="comma-separated apps whose running pods mean a node's GPU has work (GPU"
                              " hang check, from the running-pods view in Redis); empty = every app")
    bridge_running_refresh_s: float = _f(5.0, _positive, doc="running-pods view refresh period of the bridge")
    # -- worker
    feature_window_s: float = _f(30.0, _positive, doc="initial per-node feature window (DWA tunes it)")
    feature_emit_interval_s: float = _f(1.0, _non_negative, doc="at most one node-features per node per this")
    dwa_min_window_s: float = _f(5.0, _positive, doc="smallest feature window DWA may shrink to")
    dwa_max_window_s: float = _f(60.0, _positive, doc="largest feature window DWA may grow to")
    error_period_s: float = _f(5.0, _positive, doc="prediction-errors / node-weights period")
    join_ttl_s: float = _f(600.0, _positive, doc="how long an unmatched completion or prediction waits")
    retrain_debounce_s: float = _f(15.0, _non_negative, doc="at most one retrain event per key per this")
    stale_after_scrapes: float = _f(3.0, _positive, doc="metrics older than this many scrapes are stale")
    credibility_prior: float = _f(0.5, _fraction, doc="credibility of a node never evaluated")
    worker_session_timeout_s: float = _f(10.0, _positive, doc="Kafka group session timeout of the worker")
    feature_history_s: float = _f(120.0, _positive, doc="per-node bucket history; >= RTT_DWA_MAX_WINDOW_S")
    feature_bucket_s: float = _f(1.0, _positive, doc="window edge resolution")
    feature_max_metrics: int = _f(256, _positive, doc="distinct metric names kept per node")
    worker_checkpoint_interval_s: float = _f(1.0, _positive, doc="how often node state is written to the changelog")
    worker_datadir: str = _f("var/faust", doc="Faust data directory")
    cold_start_samples: int = _f(50, _positive, doc="samples of a key with no model that trigger a retrain")
    drift_threshold: float = _f(0.5, _positive, doc="Page-Hinkley threshold on per-period MAPE excess")
    drift_delta: float = _f(0.02, _non_negative, doc="Page-Hinkley tolerated MAPE increase")
    drift_min_instances: int = _f(12, _positive, doc="error periods before a node x app may signal a drift")
    drift_jump: float = _f(0.25, _non_negative, doc="one-period MAPE jump over the reference that is a drift"
                           " at once (level-shift rule; 0: off)")
    join_max_entries: int = _f(500_000, _positive, doc="keys the join buffer of one worker holds at most")
    feedback_redis_timeout_s: float = _f(1.0, _positive, doc="longest batched Redis cache write of the worker")
    retrain_growth: float = _f(0.5, _non_negative, doc="retrain a key with a model when its samples grew by this"
                               " fraction since the last retrain asked (0: never)")
    # -- trainer
    trainer_max_samples_per_key: int = _f(50_000, _positive, doc="training samples kept in memory per model key")
    trainer_cpus: str = _f("", doc='CPU list the trainer is pinned to, e.g. "2-3"; empty = no pinning')
    trainer_margin: float = _f(0.02, _fraction, doc="relative holdout RMSE improvement a challenger needs")
    trainer_gpu_apps: str = _f("gCTF,Motioncor2", doc="apps that run on a GPU, comma-separated: their models "
                                                      "never get slower on a faster GPU (monotone constraints)")
    # -- extender
    extender_host: str = _f("0.0.0.0", doc="address the extender's HTTP server binds")
    extender_port: int = _f(8888, _port, doc="port of the extender's HTTP server (and its /metrics)")
    extender_max_body_bytes: int = _f(8 * 1024 * 1024, _positive, doc="largest request body accepted (413 above)")
    extender_stale_after_s: float = _f(30.0, _positive, doc="node data older than this is stale: neutral score")
    extender_policy_file: str = _f("", doc="YAML/JSON policy: SLA per app, anti-affinity pairs, assumed pods")
    extender_publish_queue: int = _f(10_000, _positive, doc="pending rtt-predictions requests before dropping")
    extender_read_timeout_s: float = _f(5.0, _positive, doc="bound on reading one request body (408)")
    extender_rebuild_interval_s: float = _f(0.2, _positive, doc="at most one snapshot rebuild per this")
    extender_warm_timeout_s: float = _f(2.0, _positive, doc="bound on the Redis warm start")
    extender_running_refresh_s: float = _f(2.0, _positive, doc="running-apps refresh period from Redis")
    # -- model registry
    model_keep: int = _f(5, _positive, doc="model versions kept per key (plus the current one)")

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            check = field.metadata.get("check")
            if check is not None:
                problem = check(getattr(self, field.name))
                if problem:
                    raise ConfigError(_env_name(field), problem)
        if self.dwa_min_window_s > self.dwa_max_window_s:
            raise ConfigError("RTT_DWA_MIN_WINDOW_S", "must be <= RTT_DWA_MAX_WINDOW_S")

    @property
    def bootstrap_servers(self) -> str:
        return self.kafka_bootstrap or f"127.0.0.1:{EMBEDDED_BROKER_PORT}"

    @property
    def gpu_apps(self) -> frozenset[str]:
        """``trainer_gpu_apps`` as a set.

        >>> sorted(Settings(trainer_gpu_apps=" gCTF, ,Motioncor2").gpu_apps)
        ['Motioncor2', 'gCTF']
        """
        return frozenset(a.strip() for a in self.trainer_gpu_apps.split(",") if a.strip())

    @property
    def models_path(self) -> Path:
        return Path(self.models_dir)

    def topic(self, name: str) -> str:
        """The real topic name of a contract (with the configured prefix)."""
        return f"{self.topic_prefix}{name}"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            name = _env_name(field)
            if name not in env:
                continue
            raw = env[name].strip()
            kind: type = type(field.default)
            try:
                values[field.name] = kind(raw)
            except ValueError:
                raise ConfigError(name, f"must be a {kind.__name__} (got {raw!r})") from None
        values.update(overrides)
        return cls(**values)

    @classmethod
    def describe(cls) -> list[tuple[str, str, str]]:
        """(env var, default, description) for every setting, for docs and ``--help``."""
        return [(_env_name(f), repr(f.default), str(f.metadata.get("doc", ""))) for f in dataclasses.fields(cls)]

    def listing(self, environ: Mapping[str, str] | None = None) -> list[SettingRow]:
        """Every setting with its value in force, where it came from and its description; secrets masked.

        >>> rows = Settings.from_env({"REDIS_URL": "redis://:hunter2@db:6379/0"}).listing({"REDIS_URL": "x"})
        >>> [(r.variable, r.value, r.source) for r in rows if r.variable == "REDIS_URL"]
        [('REDIS_URL', 'redis://:***@db:6379/0', 'environment')]
        """
        env = os.environ if environ is None else environ
        rows = []
        for f in dataclasses.fields(self):
            name = _env_name(f)
            source = "environment" if name in env else "default"
            rows.append(SettingRow(name, display_value(getattr(self, f.name)), source, str(f.metadata.get("doc", ""))))
        return rows


@dataclasses.dataclass(frozen=True)
class SettingRow:
    variable: str
    value: str
    source: str  # environment | default
    doc: str


def display_value(value: Any) -> str:
    """A setting's value as printed: a password inside a URL is masked.

    >>> display_value("redis://user:secret@host:6379/0"), display_value(2.5), display_value("")
    ('redis://user:***@host:6379/0', '2.5', "''")
    """
    if isinstance(value, str):
        if not value:
            return "''"
        return _URL_PASSWORD.sub(r"\1***@", value)
    return str(value)


_URL_PASSWORD = re.compile(r"(://[^:/@]*:)[^@/]+@")
