"""Connection options every Kafka client of rttsched uses: bootstrap servers and transport security.

One place turns the settings (``RTT_KAFKA_SECURITY_PROTOCOL``, ``RTT_KAFKA_SASL_*``, ``RTT_KAFKA_SSL_*``)
into what aiokafka's producer, consumer and admin client take (:func:`client_options`) and what Faust
takes (:func:`faust_credentials`), so no client can be built that ignores them. The SASL password is
read from its file when a client is built (a rotated Secret is picked up by the next client); it never
appears in a log line (:mod:`app.masking`).

>>> from app.config import Settings
>>> client_options(Settings.from_env({"RTT_KAFKA_BOOTSTRAP": "k:9092"}))
{'bootstrap_servers': 'k:9092', 'security_protocol': 'PLAINTEXT'}
"""

from __future__ import annotations

import ssl
from typing import Any

import faust

from app.config import Settings, read_secret


def ssl_context(settings: Settings) -> ssl.SSLContext:
    """A client TLS context: the broker's certificate checked against ``RTT_KAFKA_SSL_CAFILE`` (else the
    system's CAs) and its host name verified; the client certificate and key when set (mutual TLS)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=settings.kafka_ssl_cafile or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if settings.kafka_ssl_certfile:
        context.load_cert_chain(settings.kafka_ssl_certfile, settings.kafka_ssl_keyfile)
    return context


def sasl_password(settings: Settings) -> str:
    return read_secret(settings.kafka_sasl_password_file, "RTT_KAFKA_SASL_PASSWORD_FILE")


def security_options(settings: Settings) -> dict[str, Any]:
    """aiokafka's security keyword arguments for ``settings``."""
    protocol = settings.kafka_security_protocol
    out: dict[str, Any] = {"security_protocol": protocol}
    if protocol.endswith("SSL"):
        out["ssl_context"] = ssl_context(settings)
    if protocol.startswith("SASL_"):
        out.update(sasl_mechanism=settings.kafka_sasl_mechanism, sasl_plain_username=settings.kafka_sasl_username,
                   sasl_plain_password=sasl_password(settings))
    return out


def client_options(settings: Settings, **extra: Any) -> dict[str, Any]:
    """Keyword arguments for ``AIOKafkaProducer`` / ``AIOKafkaConsumer`` / ``AIOKafkaAdminClient``."""
    return {"bootstrap_servers": settings.bootstrap_servers, **security_options(settings), **extra}


def consumer_options(settings: Settings, **extra: Any) -> dict[str, Any]:
    """:func:`client_options` for an ``AIOKafkaConsumer`` that must see messages soon after they are produced:
    ``fetch_max_wait_ms`` from ``RTT_KAFKA_FETCH_MAX_WAIT_MS``. A broker that answers a fetch only when its
    wait runs out (Tansu does) delays each message by up to that bound; aiokafka's default is 500 ms.

    >>> consumer_options(Settings.from_env({}), group_id=None)["fetch_max_wait_ms"]
    50
    """
    return client_options(settings, fetch_max_wait_ms=settings.kafka_fetch_max_wait_ms, **extra)


def faust_credentials(settings: Settings) -> Any:
    """``broker_credentials`` for ``faust.App``: None for PLAINTEXT."""
    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return None
    if protocol == "SSL":
        return faust.SSLCredentials(ssl_context(settings))
    context = ssl_context(settings) if protocol == "SASL_SSL" else None
    return faust.SASLCredentials(username=settings.kafka_sasl_username, password=sasl_password(settings),
                                 ssl_context=context, mechanism=settings.kafka_sasl_mechanism)
