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
import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from app.cpus import parse_cpus
from app.errors import ConfigError
from app.masking import mask_url, url_password, with_password

EMBEDDED_BROKER_PORT = 9092


KIND_WORDS = {int: "an integer", float: "a number"}  # what a bad value was expected to be, in words


def _env_name(field: dataclasses.Field[Any]) -> str:
    return str(field.metadata.get("env", f"RTT_{field.name.upper()}"))


def positive(v: float) -> str | None:
    if not v > 0:
        return f"must be > 0 (got {v})"
    return None if v < math.inf else f"must be finite (got {v})"


def non_negative(v: float) -> str | None:
    if not v >= 0:
        return f"must be >= 0 (got {v})"
    return None if v < math.inf else f"must be finite (got {v})"


def _host_port(address: str) -> str | None:
    """What is wrong with one ``host:port`` (an IPv6 host in brackets), or None."""
    host, sep, port = address.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 0 < int(port) <= 65535:
        return f"{address!r} is not host:port"
    return None


def _bootstrap(v: str) -> str | None:
    """``host:port[,host:port...]`` or empty (the embedded broker)."""
    problems = [p for p in (_host_port(a.strip()) for a in v.split(",")) if p] if v else []
    return f"must be host:port[,host:port] ({problems[0]})" if problems else None


def _redis_url(v: str) -> str | None:
    """A URL redis-py opens (``redis://``, ``rediss://``, ``unix://``) or empty (no Redis)."""
    if not v:
        return None
    try:
        parts = urlsplit(v)
        port = parts.port
    except ValueError as exc:
        return f"not a URL redis://host:port/db ({exc})"
    if parts.scheme not in ("redis", "rediss", "unix"):
        return f"must start with redis://, rediss:// or unix:// (got {mask_url(v)!r})"
    if parts.scheme != "unix" and not parts.hostname:
        return f"names no host (got {mask_url(v)!r}; redis://host:port/db)"
    if port == 0 or (parts.scheme != "unix" and parts.path.strip("/") and not parts.path.strip("/").isdigit()):
        return f"port 1-65535 and a database number, redis://host:port/db (got {mask_url(v)!r})"
    return None


def topic_name_part(v: str) -> str | None:
    """Kafka's topic names are ``[a-zA-Z0-9._-]`` only."""
    return None if re.fullmatch(r"[A-Za-z0-9._-]*", v) else f"letters, digits, '.', '_' and '-' only (got {v!r})"


def _directory(v: str) -> str | None:
    return None if not v or Path(v).is_dir() else f"no such directory ({v!r})"


def a_day_at_most(v: float) -> str | None:
    """A feature window or history: > 0 and at most a day (node-features' ``window_s`` bound)."""
    return positive(v) or (None if v <= 86_400 else f"must be <= 86400 s, a day (got {v})")


MAX_TTL_S = 3 * 86_400.0  # 3 x the longest resync (a day), the longest default TTL; its ms fit Redis's PX


def key_lifetime(v: float) -> str | None:
    """What is wrong with a key TTL in seconds (0: 3 x resync), or None: finite, >= 0, at most :data:`MAX_TTL_S`.

    >>> key_lifetime(0.0), key_lifetime(90.0), key_lifetime(float("nan")), key_lifetime(1e300)
    (None, None, 'must be >= 0 (got nan)', 'must be <= 259200 s, 3 days (got 1e+300)')
    """
    return non_negative(v) or (None if v <= MAX_TTL_S else f"must be <= {MAX_TTL_S:g} s, 3 days (got {v})")


FEATURES_PER_METRIC = 5  # the aggregates of each metric in a training sample (app.features.vector.AGGREGATES)
SAMPLE_FEATURES_MAX = 1600  # the most features a training sample carries (topics/training-samples.json)
SAMPLE_OTHER_FEATURES = 32  # room for the hardware and task columns of a sample (6 hw_* and the task's today)


def metrics_kept_max(max_apps: int) -> int:
    """The most metrics a worker may keep per node with ``max_apps`` apps: each metric's aggregates, a running-pods
    count per app and the hardware and task columns must fit a training sample.

    >>> metrics_kept_max(64)
    300
    """
    return (SAMPLE_FEATURES_MAX - max_apps - SAMPLE_OTHER_FEATURES) // FEATURES_PER_METRIC


def apps_kept_max(max_metrics: int) -> int:
    """The most apps a worker may track with ``max_metrics`` metrics kept per node (:func:`metrics_kept_max`'s
    other side).

    >>> apps_kept_max(256), metrics_kept_max(apps_kept_max(256)), metrics_kept_max(apps_kept_max(256) + 1)
    (288, 256, 255)
    """
    return SAMPLE_FEATURES_MAX - SAMPLE_OTHER_FEATURES - FEATURES_PER_METRIC * max_metrics


JOIN_PREDICTION_WAIT_S = 5.0  # RTT_JOIN_PREDICTION_WAIT_S's default; capped at RTT_JOIN_TTL_S / 2 when not set


class DefaultWait(float):
    """``RTT_JOIN_PREDICTION_WAIT_S`` not set: its value in force, ``min(5, RTT_JOIN_TTL_S / 2)``, marked as the
    default so that every :class:`Settings` made from it works it out again from its own TTL
    (``dataclasses.replace`` included) instead of keeping a cap made for another TTL.

    >>> s = Settings(join_ttl_s=4.0)
    >>> s.join_prediction_wait_s, dataclasses.replace(s, join_ttl_s=600.0).join_prediction_wait_s
    (2.0, 5.0)
    """

    __slots__ = ()


def _wait_not_below_ttl(ttl_s: float, wait_s: float) -> str:
    return f"must be < RTT_JOIN_TTL_S ({ttl_s:g}) (got {wait_s:g})"


def _port(v: int) -> str | None:
    return None if 0 <= v <= 65535 else f"must be a port between 0 and 65535 (got {v})"


def _fraction(v: float) -> str | None:
    return None if 0.0 <= v <= 1.0 else f"must be between 0 and 1 (got {v})"


def _margin(v: float) -> str | None:
    """The trainer's promotion margin: a challenger's holdout RMSE at most ``1 - margin`` of the champion's, so 1
    would promote nothing (the trainer refuses it too)."""
    return None if 0.0 <= v < 1.0 else f"must be in [0, 1) (got {v})"




def cpu_list(v: str) -> str | None:
    """What is wrong with the syntax of a CPU list (taskset's and cgroups': ``"2-3"``, ``"0,2,4-5"``), or None;
    empty (blank) is no pinning. Only its syntax (:func:`app.cpus.parse_cpus`): whether the CPUs are there is known
    on the machine that runs the trainer, which checks it when it pins itself at start
    (:func:`app.trainer.cpus.pin_cpus`).

    >>> cpu_list("0,2,4-5"), cpu_list(""), cpu_list("2-x"), cpu_list("3-1"), cpu_list(",")
    (None, None, "bad CPU list '2-x'", "bad CPU range '3-1' in '3-1'", "empty CPU list ','")
    """
    if not v.strip():
        return None
    try:
        parse_cpus(v)
    except ValueError as exc:
        return str(exc)
    return None


def _fetch_wait(v: int) -> str | None:
    return None if 1 <= v <= 5000 else f"must be between 1 and 5000 ms (got {v})"


def _one_of(*allowed: str) -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        return None if v in allowed else f"must be one of {', '.join(repr(a) for a in allowed)} (got {v!r})"
    return check


def _readable_file(v: str) -> str | None:
    if not v:
        return None
    path = Path(v)
    if not path.exists():
        return f"no such file: {v}"
    if path.is_dir():
        return f"a directory, not a file: {v} (name the file in it, such as a Secret's key)"
    if not path.is_file():
        return f"not a regular file: {v}"
    if not os.access(path, os.R_OK):
        return f"file not readable: {v}"
    return None


def check_flag(flag: str, value: Any, *checks: Callable[[Any], str | None]) -> Any:
    """``value`` of ``flag`` put through the checks the settings use (:func:`positive`, :func:`topic_name_part`
    ...), so that a flag holds to the bounds its variable does; a :class:`ConfigError` naming the flag if not.

    >>> check_flag("--rate", float("inf"), positive)
    Traceback (most recent call last):
    ...
    app.errors.ConfigError: --rate: must be finite (got inf)
    """
    for check in checks:
        problem = check(value)
        if problem:
            raise ConfigError(flag, problem)
    return value


SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def _f(default: Any, check: Callable[[Any], str | None] | None = None, env: str | None = None,
       doc: str = "") -> Any:
    meta: dict[str, Any] = {"check": check, "doc": doc}
    if env:
        meta["env"] = env
    return dataclasses.field(default=default, metadata=meta)


def read_secret(path: str, field: str = "") -> str:
    """The content of a secret file (a mounted Kubernetes Secret), without the trailing newline."""
    try:
        return Path(path).read_text(encoding="utf-8").rstrip("\r\n")
    except OSError as exc:
        raise ConfigError(field or path, f"cannot read the secret file {path}: {exc.strerror}") from None


@dataclasses.dataclass(frozen=True)
class Settings:
    # -- connections
    kafka_bootstrap: str = _f("", _bootstrap, env="RTT_KAFKA_BOOTSTRAP",
                              doc="host:port[,host:port]; empty = embedded broker on 127.0.0.1:9092")
    redis_url: str = _f("", _redis_url, env="REDIS_URL", doc="redis://host:port/db; empty = local directory registry")
    redis_timeout_s: float = _f(5.0, positive, doc="socket and connect timeout of every Redis client: a call to a"
                                " Redis that takes connections but does not answer fails after this, never hangs")
    topic_prefix: str = _f("", topic_name_part, doc="prefix for every topic name (tests use a uuid)")
    topics_dir: str = _f("", _directory, doc="the topic contracts' directory (the image sets it); empty = topics/"
                         " beside the package (read by app.contracts, which needs it before any settings)")
    topic_replication_factor: int = _f(0, non_negative, doc="replicas of every topic the project creates (its"
                                       " contracts' and the worker's own); 0 = the contract's (1, one broker)")
    models_dir: str = _f("var/models", doc="model registry directory when no Redis is configured")
    metrics_port: int = _f(0, _port, doc="Prometheus /metrics port of this process; 0 = none")
    # -- bridge
    scrape_interval_s: float = _f(1.0, positive, doc="exporter scrape interval")
    scrape_timeout_s: float = _f(2.0, positive, doc="bound on one exporter scrape (a slower one counts as failed)")
    bridge_gpu_apps: str = _f("", doc="comma-separated apps whose running pods mean a node's GPU has work (GPU"
                              " hang check, from the running-pods view in Redis); empty = every app")
    bridge_running_refresh_s: float = _f(5.0, positive, doc="running-pods view refresh period of the bridge")
    # -- worker
    feature_window_s: float = _f(30.0, a_day_at_most, doc="initial per-node feature window (DWA tunes it)")
    feature_emit_interval_s: float = _f(1.0, non_negative, doc="at most one node-features per node per this")
    dwa_min_window_s: float = _f(5.0, a_day_at_most, doc="smallest feature window DWA may shrink to")
    dwa_max_window_s: float = _f(60.0, a_day_at_most, doc="largest feature window DWA may grow to")
    error_period_s: float = _f(5.0, positive, doc="prediction-errors / node-weights period")
    join_ttl_s: float = _f(600.0, positive, doc="how long an unmatched completion or prediction waits")
    retrain_debounce_s: float = _f(15.0, non_negative,
                                   doc="at most one drift retrain event per key per this (growth and cold start"
                                       " events are not debounced)")
    stale_after_scrapes: float = _f(3.0, positive, doc="metrics older than this many scrapes are stale")
    credibility_prior: float = _f(0.5, _fraction, doc="credibility of a node never evaluated")
    worker_session_timeout_s: float = _f(10.0, positive, doc="Kafka group session timeout of the worker")
    feature_history_s: float = _f(120.0, a_day_at_most, doc="per-node bucket history; >= RTT_DWA_MAX_WINDOW_S")
    feature_bucket_s: float = _f(1.0, positive, doc="window edge resolution")
    feature_max_metrics: int = _f(256, positive, doc="distinct metric names kept per node (at most 300 with 64"
                                  " apps: its training samples must fit the contract's 1,600 features)")
    worker_checkpoint_interval_s: float = _f(1.0, positive, doc="how often node state is written to the changelog")
    worker_datadir: str = _f("var/faust", doc="Faust data directory")
    cold_start_samples: int = _f(25, positive, doc="samples of a key with no model that trigger a retrain"
                                 " (25: the fewest that train, 20 fit rows after the holdout)")
    drift_threshold: float = _f(0.5, positive, doc="Page-Hinkley threshold on per-period MAPE excess")
    drift_delta: float = _f(0.02, non_negative, doc="Page-Hinkley tolerated MAPE increase")
    drift_min_instances: int = _f(12, positive, doc="error periods before a node x app may signal a drift")
    drift_jump: float = _f(0.25, non_negative, doc="one-period MAPE jump over the reference that is a drift"
                           " at once (level-shift rule; 0: off)")
    join_max_entries: int = _f(500_000, positive, doc="keys the join buffer of one worker holds at most")
    join_prediction_wait_s: float = _f(DefaultWait(JOIN_PREDICTION_WAIT_S), non_negative,
                                       doc="longest an ok completion read before its prediction waits for it before"
                                       " its training sample goes out without it (0: none); < RTT_JOIN_TTL_S; unset:"
                                       " min(5, RTT_JOIN_TTL_S / 2)")
    feedback_redis_timeout_s: float = _f(1.0, positive, doc="longest batched Redis cache write of the worker")
    retrain_growth: float = _f(0.5, non_negative, doc="retrain a key with a model when its samples grew by this"
                               " fraction since the last retrain asked (0: never)")
    # -- trainer
    trainer_max_samples_per_key: int = _f(50_000, positive, doc="training samples kept in memory per model key")
    trainer_key_idle_s: float = _f(86_400.0, positive, doc="a model key with no new training sample for this"
                                   " long has its sample history dropped (its model keeps serving)")
    trainer_max_keys: int = _f(1_000, positive, doc="model keys whose sample history the trainer holds at most: a"
                               " sample of a new key beyond it is refused (dead-lettered, model_keys_full) until a"
                               " held key has had no sample for RTT_TRAINER_KEY_IDLE_S, unless its key has a model:"
                               " that one takes the place of the key idle longest without one. Not the least"
                               " recently used key at once: invented keys would then push out keys still gathering"
                               " samples for their first model (docs/deploy.md, Trainer memory)")
    trainer_cpus: str = _f("", cpu_list, doc='CPU list the trainer is pinned to, e.g. "2-3"; empty = no pinning'
                           " (its syntax checked here, the CPUs by the trainer at start)")
    trainer_margin: float = _f(0.02, _margin, doc="relative holdout RMSE improvement a challenger needs (below 1)")
    trainer_gpu_apps: str = _f("gCTF,Motioncor2", doc="apps that run on a GPU, comma-separated: their models "
                                                      "never get slower on a faster GPU (monotone constraints)")
    # -- extender
    extender_host: str = _f("0.0.0.0", doc="address the extender's HTTP server binds")
    extender_port: int = _f(8888, _port, doc="port of the extender's HTTP server (and its /metrics)")
    extender_max_body_bytes: int = _f(8 * 1024 * 1024, positive, doc="largest request body accepted (413 above)")
    extender_stale_after_s: float = _f(30.0, positive, doc="node data older than this is stale: neutral score")
    extender_policy_file: str = _f("", doc="YAML/JSON policy: SLA per app, anti-affinity pairs, assumed pods")
    extender_publish_queue: int = _f(10_000, positive, doc="pending rtt-predictions requests before dropping")
    extender_read_timeout_s: float = _f(5.0, positive, doc="bound on reading one request body (408)")
    extender_rebuild_interval_s: float = _f(0.2, positive, doc="at most one snapshot rebuild per this")
    extender_warm_timeout_s: float = _f(2.0, positive, doc="bound on the Redis warm start")
    extender_running_refresh_s: float = _f(2.0, positive, doc="running-apps refresh period from Redis")
    # -- extender: connection bounds, HTTPS, start-up reports
    extender_header_timeout_s: float = _f(5.0, positive, doc="bound on receiving one request's header block (408)")
    extender_idle_timeout_s: float = _f(75.0, positive, doc="idle keep-alive connections are closed after this")
    extender_max_connections: int = _f(1024, positive, doc="open connections beyond this are answered 503")
    extender_tls_cert: str = _f("", doc="PEM certificate (chain) file: serve HTTPS; needs RTT_EXTENDER_TLS_KEY")
    extender_tls_key: str = _f("", doc="PEM private key file of RTT_EXTENDER_TLS_CERT")
    extender_report_s: float = _f(10.0, positive, doc="while Kafka or its topics are missing, say so every this")
    # -- pods watcher (``rttsched pods``; its flags override these)
    pods_api_url: str = _f("", doc="Kubernetes API of the pods watcher, e.g. http://127.0.0.1:8001 behind kubectl"
                           " proxy; empty = in cluster, with the pod's service account")
    pods_token_file: str = _f("", doc="bearer token file of the pods watcher, re-read on every request; empty ="
                              " the service account's in cluster")
    pods_ca_file: str = _f("", doc="CA bundle of the pods watcher for an https API URL")
    pods_resync_s: float = _f(30.0, a_day_at_most,
                              doc="seconds between the pods watcher's key renewals while it watches (--poll: lists)")
    pods_ttl_s: float = _f(0.0, key_lifetime, doc="life of a node's running-pods key that no sync confirms;"
                           " 0 = 3 x RTT_PODS_RESYNC_S")
    # -- model registry
    model_keep: int = _f(5, positive, doc="model versions kept per key (plus the current one)")
    # -- faults, bounds and secure transport (docs/runbook.md, docs/deploy.md)
    kafka_security_protocol: str = _f("PLAINTEXT", _one_of(*SECURITY_PROTOCOLS),
                                      doc="PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL (every Kafka client and Faust)")
    kafka_sasl_mechanism: str = _f("", _one_of(*SASL_MECHANISMS), doc="PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512"
                                   " (required with SASL_*)")
    kafka_sasl_username: str = _f("", doc="SASL user name")
    kafka_sasl_password_file: str = _f("", _readable_file, doc="file holding the SASL password (a mounted Secret)")
    kafka_ssl_cafile: str = _f("", _readable_file, doc="CA bundle (PEM) the broker's certificate is checked"
                               " against; empty = the system's")
    kafka_ssl_certfile: str = _f("", _readable_file, doc="client certificate (PEM) for mutual TLS")
    kafka_ssl_keyfile: str = _f("", _readable_file, doc="client private key (PEM) for mutual TLS")
    kafka_fetch_max_wait_ms: int = _f(50, _fetch_wait, doc="longest a fetch of the extender's view, the worker's"
                                      " intakes and model-updates and the trainer's consumers waits for data"
                                      " (a broker that holds a fetch to this bound delays every message by up"
                                      " to it)")
    redis_password_file: str = _f("", _readable_file, doc="file holding the Redis password (a mounted Secret);"
                                  " added to REDIS_URL when connecting")
    metrics_host: str = _f("0.0.0.0", doc="address the /metrics server of the worker, trainer, bridge and pods"
                           " binds (127.0.0.1: this machine only)")
    max_clock_skew_s: float = _f(300.0, positive, doc="a message ts further than this in the future is a"
                                 " dead letter (ts_in_future)")
    max_event_age_s: float = _f(86_400.0, positive, doc="a message ts older than this is a dead letter"
                                " (ts_too_old)")
    node_evict_after_s: float = _f(600.0, positive, doc="a node silent this long leaves the worker's state,"
                                   " metrics and the compacted topics")
    worker_max_nodes: int = _f(5_000, positive, doc="nodes one worker holds at most; a new one beyond is a"
                               " dead letter (node_cap)")
    worker_max_apps: int = _f(64, positive, doc="apps one worker tracks at most; a new one beyond is a dead"
                              " letter (app_cap)")
    retry_max_backoff_s: float = _f(5.0, positive, doc="longest wait between two tries of a model load or"
                                    " retrain that failed because Redis was away")
    registry_check_s: float = _f(30.0, non_negative, doc="the trainer compares the registry with model-updates"
                                 " this often and repairs a registry that lost its data (0: never)")
    kafka_start_wait_s: float = _f(0.0, non_negative, doc="how long the worker, trainer and bridge wait at start"
                                   " for the broker and their topics before they exit (code 2); 0 = until it"
                                   " answers. A broker that refuses the settings (SASL, TLS, security protocol) is"
                                   " not waited for")

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            check = field.metadata.get("check")
            if check is not None:
                problem = check(getattr(self, field.name))
                if problem:
                    raise ConfigError(_env_name(field), problem)
        if self.dwa_min_window_s > self.dwa_max_window_s:
            raise ConfigError("RTT_DWA_MIN_WINDOW_S", "must be <= RTT_DWA_MAX_WINDOW_S")
        if isinstance(self.join_prediction_wait_s, DefaultWait):  # not set: capped by the TTL (a short one was
            # valid before the wait existed), from this TTL every time
            object.__setattr__(self, "join_prediction_wait_s",
                               DefaultWait(min(JOIN_PREDICTION_WAIT_S, self.join_ttl_s / 2)))
        elif self.join_prediction_wait_s >= self.join_ttl_s:  # its join entry would leave first
            raise ConfigError("RTT_JOIN_PREDICTION_WAIT_S",
                              _wait_not_below_ttl(self.join_ttl_s, self.join_prediction_wait_s))
        if metrics_kept_max(self.worker_max_apps) < 1:  # no room left for a single metric's aggregates
            most = SAMPLE_FEATURES_MAX - SAMPLE_OTHER_FEATURES - FEATURES_PER_METRIC
            raise ConfigError("RTT_WORKER_MAX_APPS", f"must be <= {most} (got {self.worker_max_apps}): a training "
                              f"sample carries a running-pods count per app within its {SAMPLE_FEATURES_MAX:,} "
                              "features (topics/training-samples.json)")
        if self.feature_max_metrics > (most := metrics_kept_max(self.worker_max_apps)):
            raise ConfigError("RTT_FEATURE_MAX_METRICS", f"must be <= {most} with RTT_WORKER_MAX_APPS="
                              f"{self.worker_max_apps} (got {self.feature_max_metrics}): the training samples of a "
                              f"node keeping more would carry more than {SAMPLE_FEATURES_MAX:,} features, which the "
                              "trainer refuses (topics/training-samples.json)")
        if bool(self.extender_tls_cert) != bool(self.extender_tls_key):
            missing = "RTT_EXTENDER_TLS_KEY" if self.extender_tls_cert else "RTT_EXTENDER_TLS_CERT"
            raise ConfigError(missing, "HTTPS needs both RTT_EXTENDER_TLS_CERT and RTT_EXTENDER_TLS_KEY")
        self._check_security()

    def _check_security(self) -> None:
        sasl = self.kafka_security_protocol.startswith("SASL_")
        sasl_set = [name for name, value in (("RTT_KAFKA_SASL_MECHANISM", self.kafka_sasl_mechanism),
                                             ("RTT_KAFKA_SASL_USERNAME", self.kafka_sasl_username),
                                             ("RTT_KAFKA_SASL_PASSWORD_FILE", self.kafka_sasl_password_file)) if value]
        if sasl_set and not sasl:  # they would be ignored: the clients would connect without SASL
            raise ConfigError("RTT_KAFKA_SECURITY_PROTOCOL",
                              f"{', '.join(sasl_set)} {'is' if len(sasl_set) == 1 else 'are'} set but the protocol "
                              f"is {self.kafka_security_protocol}: SASL needs SASL_PLAINTEXT or SASL_SSL")
        if sasl and not self.kafka_sasl_mechanism:
            raise ConfigError("RTT_KAFKA_SASL_MECHANISM", f"required with {self.kafka_security_protocol}")
        if sasl and not (self.kafka_sasl_username and self.kafka_sasl_password_file):
            missing = "RTT_KAFKA_SASL_USERNAME" if not self.kafka_sasl_username else "RTT_KAFKA_SASL_PASSWORD_FILE"
            raise ConfigError(missing, f"required with {self.kafka_security_protocol}")
        if bool(self.kafka_ssl_certfile) != bool(self.kafka_ssl_keyfile):
            missing = "RTT_KAFKA_SSL_KEYFILE" if self.kafka_ssl_certfile else "RTT_KAFKA_SSL_CERTFILE"
            raise ConfigError(missing, "a client certificate needs its key, and the other way round")
        tls_files = self.kafka_ssl_cafile or self.kafka_ssl_certfile
        if tls_files and not self.kafka_security_protocol.endswith("SSL"):
            raise ConfigError("RTT_KAFKA_SECURITY_PROTOCOL",
                              f"TLS files are set but the protocol is {self.kafka_security_protocol}")

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

    @property
    def redis_client_url(self) -> str:
        """``redis_url`` with the password of ``RTT_REDIS_PASSWORD_FILE`` in it (never log this; see app.masking)."""
        if not self.redis_url or not self.redis_password_file:
            return self.redis_url
        return with_password(self.redis_url, read_secret(self.redis_password_file, "RTT_REDIS_PASSWORD_FILE"))

    def secrets(self) -> list[str]:
        """Every secret value these settings hold or point at (masked in logs by :mod:`app.masking`)."""
        out = [url_password(self.redis_url)]
        for path in (self.redis_password_file, self.kafka_sasl_password_file):
            if path:
                out.append(read_secret(path))
        return [s for s in out if s]

    def topic(self, name: str) -> str:
        """The real topic name of a contract (with the configured prefix)."""
        return f"{self.topic_prefix}{name}"

    def replicas(self, contract_replicas: int = 1) -> int:
        """The replication factor a created topic gets: ``RTT_TOPIC_REPLICATION_FACTOR``, else the contract's.

        >>> Settings().replicas(1), Settings(topic_replication_factor=3).replicas(1)
        (1, 3)
        """
        return self.topic_replication_factor or contract_replicas

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            name = _env_name(field)
            if name not in env:
                continue
            raw = env[name].strip()
            kind: type = float if isinstance(field.default, float) else type(field.default)  # a set DefaultWait too
            try:
                values[field.name] = kind(raw)
            except ValueError:
                raise ConfigError(name, f"must be {KIND_WORDS.get(kind, 'a ' + kind.__name__)} (got {raw!r})") from None
        values.update(overrides)
        try:
            settings = cls(**values)
        except ConfigError as exc:
            # too many apps for the metrics kept: named as the variable set, not the default it does not fit
            if (exc.field != "RTT_FEATURE_MAX_METRICS" or "feature_max_metrics" in values
                    or "worker_max_apps" not in values):
                raise
            apps, metrics = values["worker_max_apps"], cls.feature_max_metrics
            raise ConfigError("RTT_WORKER_MAX_APPS", f"must be <= {apps_kept_max(metrics)} with RTT_FEATURE_MAX_"
                              f"METRICS={metrics}, its default (got {apps}): a training sample carries a running-pods "
                              f"count per app and {FEATURES_PER_METRIC} features per metric kept within its "
                              f"{SAMPLE_FEATURES_MAX:,} (topics/training-samples.json); or set RTT_FEATURE_MAX_METRICS "
                              f"<= {metrics_kept_max(apps)}") from None
        return settings

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
    ('redis://user:***@host:6379/0', '2.5', '')
    """
    if isinstance(value, str):
        return mask_url(value)
    return str(value)
