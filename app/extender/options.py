"""The extender's knobs: the shared :class:`~app.config.Settings` plus a few of its own.

Each option is read from its Settings field (``RTT_EXTENDER_*``); Settings validates them at start, so a bad
value raises :class:`~app.errors.ConfigError` naming the variable. ``running_stale_s``, how long (on the
extender's clock) the running-apps view may go without a new confirmation from the pods watcher before the
extender calls it stale, is twice the pods watcher's ``RTT_PODS_RESYNC_S``.

>>> from app.config import Settings
>>> o = ExtenderOptions.from_settings(Settings.from_env({"RTT_EXTENDER_PUBLISH_QUEUE": "100"}))
>>> o.publish_queue, o.max_body_bytes, o.running_stale_s
(100, 8388608, 60.0)
>>> ExtenderOptions.from_settings(Settings.from_env({"RTT_PODS_RESYNC_S": "10"})).running_stale_s
20.0
>>> ExtenderOptions.from_settings(Settings.from_env({"RTT_EXTENDER_READ_TIMEOUT_S": "0"}))
Traceback (most recent call last):
...
app.errors.ConfigError: RTT_EXTENDER_READ_TIMEOUT_S: must be > 0 (got 0.0)
"""

from __future__ import annotations

import dataclasses
from typing import Any

# option -> Settings field
_OWN: dict[str, str] = {
    "policy_file": "extender_policy_file",
    "publish_queue": "extender_publish_queue",
    "read_timeout_s": "extender_read_timeout_s",
    "rebuild_interval_s": "extender_rebuild_interval_s",
    "warm_timeout_s": "extender_warm_timeout_s",
    "running_refresh_s": "extender_running_refresh_s",
    "header_timeout_s": "extender_header_timeout_s",
    "idle_timeout_s": "extender_idle_timeout_s",
    "max_connections": "extender_max_connections",
    "tls_cert": "extender_tls_cert",
    "tls_key": "extender_tls_key",
    "report_s": "extender_report_s",
}


@dataclasses.dataclass(frozen=True)
class ExtenderOptions:
    host: str = "0.0.0.0"
    port: int = 8888
    max_body_bytes: int = 8 * 1024 * 1024
    stale_after_s: float = 30.0
    credibility_prior: float = 0.5
    policy_file: str = ""  # YAML/JSON: SLA per app, anti-affinity pairs, contention, assumed-pod TTL
    publish_queue: int = 10_000  # pending rtt-predictions requests; beyond it they are dropped and counted
    read_timeout_s: float = 5.0  # reading one request body
    rebuild_interval_s: float = 0.2  # at most one snapshot rebuild per this while messages stream in
    warm_timeout_s: float = 2.0  # bound on the warm start from Redis
    running_refresh_s: float = 2.0  # period of the running-apps refresh from Redis
    running_stale_s: float = 60.0  # a running-apps view seen unconfirmed this long is stale: 2 x RTT_PODS_RESYNC_S
    header_timeout_s: float = 5.0  # first byte of a request -> end of its header block (408)
    idle_timeout_s: float = 75.0  # kept-alive connection without a request
    max_connections: int = 1024  # beyond this a new connection is answered 503
    tls_cert: str = ""  # PEM files: HTTPS when both are set
    tls_key: str = ""
    report_s: float = 10.0  # while Kafka or a topic is missing, log it every this

    @classmethod
    def from_settings(cls, settings: Any) -> ExtenderOptions:
        values: dict[str, Any] = {
            "host": settings.extender_host, "port": settings.extender_port,
            "max_body_bytes": settings.extender_max_body_bytes, "stale_after_s": settings.extender_stale_after_s,
            "credibility_prior": settings.credibility_prior,
            # a healthy pods watcher renews every value each resync; one more resync of slack for a late renewal
            "running_stale_s": 2 * settings.pods_resync_s,
        }
        values.update({option: getattr(settings, field) for option, field in _OWN.items()})
        return cls(**values)
