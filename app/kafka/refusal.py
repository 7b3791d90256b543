"""Why a broker turns this client away for good: a setting to fix, which waiting for the broker does not heal.

aiokafka's bootstrap logs why each connection failed and raises a bare ``Unable to bootstrap from …``: a wrong
password, a certificate signed by another CA and a broker that is not up yet all look alike to its caller. After
such a failure :func:`refusal` connects to each bootstrap address once more with the same settings (aiokafka's
``create_conn``: TCP, TLS, ApiVersions, the SASL handshake and authentication) to learn the reason, and says
whether it is permanent (:class:`Refusal`, naming the settings to check) or may pass (None: keep waiting).

Permanent (:func:`classify`):

* SASL authentication failed (``SASL_AUTHENTICATION_FAILED``, 58; aiokafka's ``AuthenticationFailedError``; the
  ``KeyError``/``ValueError`` aiokafka's SCRAM client raises on a server-final message carrying an error, ``e=…``,
  instead of its signature, as Tansu sends):
  ``RTT_KAFKA_SASL_USERNAME`` / ``RTT_KAFKA_SASL_PASSWORD_FILE`` / ``RTT_KAFKA_SASL_MECHANISM``. A user not yet
  created, or a password rotated on the broker before the Secret, heals only by a restart that reads the file
  again, which the supervisor does after the exit.
* A SASL mechanism the broker does not take (``UNSUPPORTED_SASL_MECHANISM``, 33): ``RTT_KAFKA_SASL_MECHANISM``.
* ``ILLEGAL_SASL_STATE`` (34), a SASL handshake on a listener without SASL: ``RTT_KAFKA_SECURITY_PROTOCOL``.
* The broker's certificate not verified (``ssl.SSLCertVerificationError``): ``RTT_KAFKA_SSL_CAFILE``, or
  ``RTT_KAFKA_BOOTSTRAP`` for a host name the certificate does not name. Not a certificate expired or not yet
  valid: the broker's renewed certificate, or a clock a moment behind one just issued, heals that (waited for).
* A TLS error that says the peer does not speak TLS (``WRONG_VERSION_NUMBER`` …) or would not take the client's
  certificate (``…_ALERT_CERTIFICATE_REQUIRED``, ``…_ALERT_BAD_CERTIFICATE`` …): ``RTT_KAFKA_SECURITY_PROTOCOL``,
  ``RTT_KAFKA_SSL_CERTFILE`` / ``RTT_KAFKA_SSL_KEYFILE``.
* The other protocol answering on the port: a Kafka ApiVersions answer without TLS to a TLS client
  (``SSL``/``SASL_SSL``: asked first, since a TLS handshake with a plaintext Kafka listener hangs until its
  timeout), a completed TLS handshake to a client without TLS whose connection was closed. A
  listener speaks one protocol: ``RTT_KAFKA_SECURITY_PROTOCOL``.
* A SASL listener to a client without SASL: it answers ApiVersions, closes the connection at the next request
  (the bootstrap's Metadata), and answers a SASL handshake with the mechanisms it offers:
  ``RTT_KAFKA_SECURITY_PROTOCOL`` (``SASL_PLAINTEXT`` or ``SASL_SSL``, with the ``RTT_KAFKA_SASL_*`` settings).

May pass (None): a refused connection, a timeout, a host name that does not resolve (yet), a connection closed
with no other protocol answering (a mutual-TLS listener that drops a client without a certificate looks so too),
any other TLS error (a connection cut mid-handshake), a broker that answers this connection and its Metadata
request (what failed was not the settings). Each address is asked once per failed start, each connection bounded
by ``CONNECT_S``, each probe by ``PROBE_S``; when no address answers, the first permanent refusal stands, whatever
the others said (one cluster, one set of settings).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from collections.abc import Iterator
from typing import Any

from aiokafka.conn import collect_hosts, create_conn
from aiokafka.errors import (
    AuthenticationFailedError,
    IllegalSaslStateError,
    KafkaConnectionError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)
from aiokafka.protocol.admin import SaslHandShakeRequest
from aiokafka.protocol.metadata import MetadataRequest

from app.config import Settings
from app.kafka.client import security_options

CONNECT_S = 3.0  # the second connection's bound (its TCP connect, TLS handshake and each request): a broker
# slower than that is waited for, as any that does not answer
PROBE_S = 2.0  # the other protocol's probe
PROBE_MECHANISM = "SCRAM-SHA-512"  # what a SASL probe asks for: a SASL listener lists its mechanisms either way
CERT_HOST_MISMATCH = 62  # X509_V_ERR_HOSTNAME_MISMATCH
CERT_DATES = (9, 10)  # X509_V_ERR_CERT_NOT_YET_VALID, X509_V_ERR_CERT_HAS_EXPIRED
NOT_TLS = ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST", "UNKNOWN_PROTOCOL")
CLIENT_CERT = ("ALERT_CERTIFICATE_REQUIRED", "ALERT_BAD_CERTIFICATE", "ALERT_UNKNOWN_CA", "ALERT_CERTIFICATE_UNKNOWN",
               "ALERT_CERTIFICATE_REVOKED", "ALERT_CERTIFICATE_EXPIRED", "ALERT_ACCESS_DENIED")
TLS_VERSION = ("ALERT_PROTOCOL_VERSION", "UNSUPPORTED_PROTOCOL", "NO_PROTOCOLS_AVAILABLE")
ENABLED = "Enabled mechanisms are: "  # how aiokafka's UnsupportedSaslMechanismError lists the broker's
SASL_FIELDS = ("RTT_KAFKA_SASL_USERNAME", "RTT_KAFKA_SASL_PASSWORD_FILE", "RTT_KAFKA_SASL_MECHANISM")


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A permanent refusal: ``reason`` (the broker's or TLS's), ``fields`` (the settings to check) and a ``hint``."""

    reason: str
    fields: tuple[str, ...]
    hint: str = ""

    def message(self, bootstrap: str) -> str:
        """One line: where, why, what to check.

        >>> Refusal("SASL authentication failed", ("RTT_KAFKA_SASL_USERNAME",)).message("k:9093").split("; ")
        ['cannot use Kafka at k:9093 (RTT_KAFKA_BOOTSTRAP): SASL authentication failed', \
'check RTT_KAFKA_SASL_USERNAME: waiting would not change it']
        """
        hint = f" ({self.hint})" if self.hint else ""
        return (f"cannot use Kafka at {bootstrap} (RTT_KAFKA_BOOTSTRAP): {self.reason}; check "
                f"{', '.join(self.fields)}{hint}: waiting would not change it")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and its causes (aiokafka keeps a closed connection's reason as the cause of its error)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__  # type: ignore[assignment]


def classify(exc: BaseException, settings: Settings) -> Refusal | None:
    """The permanent refusal ``exc`` (an error of aiokafka's ``create_conn``, or its cause) says, if it says one.

    >>> from aiokafka.errors import SaslAuthenticationFailed
    >>> s = Settings.from_env({})
    >>> classify(SaslAuthenticationFailed("Invalid username or password"), s).fields
    ('RTT_KAFKA_SASL_USERNAME', 'RTT_KAFKA_SASL_PASSWORD_FILE', 'RTT_KAFKA_SASL_MECHANISM')
    >>> classify(ConnectionRefusedError(111, "Connect call failed"), s) is None
    True
    """
    for e in _chain(exc):
        said = _tls(e, settings) or _sasl(e, settings)
        if said is not None:
            return said
    return None


def _sasl(e: BaseException, settings: Settings) -> Refusal | None:
    mechanism = settings.kafka_sasl_mechanism
    failed = f"SASL authentication as {settings.kafka_sasl_username!r} with {mechanism} failed"
    if isinstance(e, SaslAuthenticationFailed | AuthenticationFailedError):
        detail = e.args[0] if e.args and isinstance(e.args[0], str) and e.args[0] else type(e).__name__
        return Refusal(f"{failed}: {detail}", SASL_FIELDS)
    if (isinstance(e, KeyError | ValueError) and not isinstance(e, OSError) and mechanism.startswith("SCRAM-")
            and settings.kafka_security_protocol.startswith("SASL_")):  # aiokafka's SCRAM client on the broker's answer
        detail = (f"the broker's last SCRAM message has no server signature ({e}): a SCRAM error such as unknown-user"
                  " or invalid-proof" if isinstance(e, KeyError) else f"the SCRAM exchange failed: {e}")
        return Refusal(f"{failed}: {detail}", SASL_FIELDS)
    if isinstance(e, UnsupportedSaslMechanismError):
        text = str(e.args[0]) if e.args else ""
        offered = f", it takes {text.split(ENABLED)[-1]}" if ENABLED in text else ""
        return Refusal(f"the broker does not take SASL mechanism {mechanism} (UNSUPPORTED_SASL_MECHANISM{offered})",
                       ("RTT_KAFKA_SASL_MECHANISM", "RTT_KAFKA_SECURITY_PROTOCOL"))
    if isinstance(e, IllegalSaslStateError):
        return Refusal("the broker refused the SASL handshake (ILLEGAL_SASL_STATE): the listener does not expect SASL,"
                       f" RTT_KAFKA_SECURITY_PROTOCOL is {settings.kafka_security_protocol}",
                       ("RTT_KAFKA_SECURITY_PROTOCOL",))
    return None


def _tls(e: BaseException, settings: Settings) -> Refusal | None:
    if isinstance(e, ssl.SSLCertVerificationError):
        if e.verify_code in CERT_DATES:
            return None  # renewed on the broker, or this clock behind a certificate just issued: may pass
        said = f"TLS: the broker's certificate was not verified: {e.verify_message or e.reason}"
        if e.verify_code == CERT_HOST_MISMATCH:
            return Refusal(said, ("RTT_KAFKA_BOOTSTRAP",), "a host name the broker's certificate names")
        cafile = settings.kafka_ssl_cafile or "unset: the system's CAs"
        return Refusal(said, ("RTT_KAFKA_SSL_CAFILE",), f"the CA that signed the broker's certificate; now {cafile}")
    if not isinstance(e, ssl.SSLError) or isinstance(e, ssl.SSLEOFError | ssl.SSLZeroReturnError):
        return None  # a connection cut mid-handshake: may pass
    reason = str(e.reason or "")
    said = f"TLS: {e.reason or e}"
    if any(r in reason for r in NOT_TLS):
        return Refusal(f"{said}: the listener does not speak TLS, RTT_KAFKA_SECURITY_PROTOCOL is "
                       f"{settings.kafka_security_protocol}", ("RTT_KAFKA_SECURITY_PROTOCOL",))
    if any(r in reason for r in CLIENT_CERT):
        return Refusal(f"{said}: the broker did not take the client's certificate",
                       ("RTT_KAFKA_SSL_CERTFILE", "RTT_KAFKA_SSL_KEYFILE"))
    if any(r in reason for r in TLS_VERSION):
        return Refusal(f"{said}: no TLS version both sides speak (rttsched needs TLS 1.2 or later)",
                       ("RTT_KAFKA_SECURITY_PROTOCOL",))
    return None  # another TLS error: not known to be for good


def _cut(exc: BaseException) -> bool:
    """Whether the connection was made and then closed or cut, as a TLS listener does to a client without TLS: not
    refused, unreachable, a name not resolved, nor silent (a TLS listener answers a client without TLS at once)."""
    if isinstance(exc, TimeoutError):
        return False
    if isinstance(exc, ConnectionResetError | BrokenPipeError | ssl.SSLError):
        return True
    return not isinstance(exc, OSError)  # KafkaConnectionError (closed), IncompleteReadError …


async def _speaks_plain_kafka(host: str, port: int) -> bool:
    try:
        conn = await create_conn(host, port, request_timeout_ms=int(PROBE_S * 1000))  # ApiVersions, no TLS
    except Exception:  # noqa: BLE001 - no answer of any kind: not plaintext Kafka
        return False
    conn.close()
    return True


async def _speaks_tls(host: str, port: int) -> bool:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # a probe for TLS itself: no data is sent over it
    context.verify_mode = ssl.CERT_NONE
    try:
        async with asyncio.timeout(PROBE_S):
            _, writer = await asyncio.open_connection(host, port, ssl=context)
    except Exception:  # noqa: BLE001 - no TLS handshake completed
        return False
    writer.transport.abort()  # closed now: close() would wait for the peer's close_notify, which may never come,
    await writer.wait_closed()  # and leave the socket open as the process exits on the refusal
    return True


def _plain_answered(host: str, port: int, protocol: str) -> Refusal:
    return Refusal(f"{host}:{port} answers Kafka without TLS, RTT_KAFKA_SECURITY_PROTOCOL is {protocol}",
                   ("RTT_KAFKA_SECURITY_PROTOCOL",), "PLAINTEXT or SASL_PLAINTEXT for that listener")


def _tls_answered(host: str, port: int, protocol: str) -> Refusal:
    return Refusal(f"{host}:{port} speaks TLS, RTT_KAFKA_SECURITY_PROTOCOL is {protocol}",
                   ("RTT_KAFKA_SECURITY_PROTOCOL",), "SSL or SASL_SSL for that listener")


async def _wants_sasl(host: str, port: int, options: dict[str, Any]) -> list[str]:
    """The SASL mechanisms a listener offers in answer to a SASL handshake (none: it does not speak SASL, or said
    nothing)."""
    try:
        conn = await create_conn(host, port, request_timeout_ms=int(PROBE_S * 1000), **options)
    except Exception:  # noqa: BLE001 - not even the connection: nothing said
        return []
    try:
        answer = await conn.send(SaslHandShakeRequest(PROBE_MECHANISM))
    except Exception:  # noqa: BLE001 - no answer: nothing said
        return []
    finally:
        conn.close()
    return list(answer.enabled_mechanisms) if answer.error_code in (0, UnsupportedSaslMechanismError.errno) else []


async def _ask(host: str, port: int, settings: Settings, options: dict[str, Any]) -> tuple[bool, Refusal | None]:
    """Whether the address answers this client now, and the permanent refusal it said if it did not."""
    protocol = settings.kafka_security_protocol
    tls = protocol.endswith("SSL")
    if tls and await _speaks_plain_kafka(host, port):  # a TLS handshake with a plaintext listener hangs until its
        return False, _plain_answered(host, port, protocol)  # timeout: that listener is asked first
    try:
        conn = await create_conn(host, port, request_timeout_ms=int(CONNECT_S * 1000), **options)
    except Exception as exc:  # noqa: BLE001 - each is classified; none leaves here
        said = classify(exc, settings)
        if said is None and not tls and _cut(exc) and await _speaks_tls(host, port):
            said = _tls_answered(host, port, protocol)
        return False, said
    try:  # a SASL listener answers ApiVersions before the authentication, and closes the connection at the next
        await conn.send(MetadataRequest([]))  # request of a client that did not authenticate: the bootstrap's own
    except KafkaConnectionError:
        if protocol.startswith("SASL_"):
            return False, None
        offered = await _wants_sasl(host, port, options)
        return False, (Refusal(f"{host}:{port} closed the connection at the first request after ApiVersions and "
                               f"offers SASL ({', '.join(offered)}), RTT_KAFKA_SECURITY_PROTOCOL is {protocol}",
                               ("RTT_KAFKA_SECURITY_PROTOCOL", "RTT_KAFKA_SASL_MECHANISM"),
                               "SASL_PLAINTEXT or SASL_SSL, with the RTT_KAFKA_SASL_* settings") if offered else None)
    except Exception:  # noqa: BLE001 - no answer in time, an error: may pass
        return False, None
    finally:
        conn.close()
    return True, None


async def refusal(settings: Settings, options: dict[str, Any] | None = None) -> Refusal | None:
    """Ask each bootstrap address once with ``settings`` (``options``: aiokafka's security keywords, default
    theirs): the permanent :class:`Refusal` when no address answers and one refused the client for good; None when
    one answers, or none said why for good (unreachable, silent: worth waiting for)."""
    options = security_options(settings) if options is None else options
    found: Refusal | None = None
    for host, port, _ in collect_hosts(settings.bootstrap_servers):
        answers, said = await _ask(host, port, settings, options)
        if answers:
            return None  # what failed may pass
        found = found or said
    return found
