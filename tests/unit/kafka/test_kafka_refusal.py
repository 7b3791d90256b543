"""Which of aiokafka's connection errors are a setting to fix (:func:`app.kafka.refusal.classify`), on aiokafka's own
exception types as its ``create_conn`` raises them, and :func:`app.kafka.admin.wait_reachable` not waiting for them.

The embedded broker cannot fail a SASL authentication (Tansu 0.6 answers a SCRAM exchange it cannot complete with
a message aiokafka does not parse), so SASL_AUTHENTICATION_FAILED (58), ILLEGAL_SASL_STATE (34) and aiokafka's
AuthenticationFailedError are classified here; UNSUPPORTED_SASL_MECHANISM (33) and the TLS cases also happen for
real in tests/integration/test_kafka_refused.py.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Sequence
from pathlib import Path

import pytest
from aiokafka.errors import (
    AuthenticationFailedError,
    IllegalSaslStateError,
    KafkaConnectionError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)

from app.config import Settings
from app.kafka.admin import KafkaRefused, TopicError, wait_reachable
from app.kafka.refusal import SASL_FIELDS, Refusal, classify


@pytest.fixture
def sasl(tmp_path: Path) -> Settings:
    password = tmp_path / "password"
    password.write_text("hunter2")
    return Settings.from_env({}, kafka_bootstrap="k:9093", kafka_security_protocol="SASL_SSL",
                             kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username="alice",
                             kafka_sasl_password_file=str(password))


def closed_by(cause: BaseException) -> KafkaConnectionError:
    """aiokafka's error for a request on a connection closed for ``cause`` (``AIOKafkaConnection.close``)."""
    error = KafkaConnectionError("Connection at k:9093 closed")
    error.__cause__ = cause
    return error


def ssl_error(cls: type[ssl.SSLError], reason: str, **attrs: object) -> ssl.SSLError:
    error = cls(1, f"[SSL: {reason}] {reason.lower().replace('_', ' ')} (_ssl.c:1006)")
    error.reason = reason  # type: ignore[misc]
    for name, value in attrs.items():
        setattr(error, name, value)
    return error


def test_a_failed_sasl_authentication_names_the_credentials_and_says_the_brokers_reason(sasl: Settings) -> None:
    said = classify(SaslAuthenticationFailed("Authentication failed during authentication due to invalid credentials"
                                             " with SASL mechanism SCRAM-SHA-512"), sasl)
    assert said is not None and said.fields == SASL_FIELDS == (
        "RTT_KAFKA_SASL_USERNAME", "RTT_KAFKA_SASL_PASSWORD_FILE", "RTT_KAFKA_SASL_MECHANISM")
    assert said.reason == ("SASL authentication as 'alice' with SCRAM-SHA-512 failed: Authentication failed during "
                           "authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512")
    assert "hunter2" not in said.message(sasl.bootstrap_servers)
    assert SaslAuthenticationFailed.errno == 58
    other = classify(AuthenticationFailedError(), sasl)
    assert other is not None and other.fields == SASL_FIELDS and other.reason.endswith(": AuthenticationFailedError")


def test_a_scram_answer_aiokafka_cannot_read_is_a_failed_authentication(sasl: Settings) -> None:
    said = classify(KeyError("v"), sasl)  # a server-final message with e=invalid-proof: no v= signature
    assert said is not None and said.fields == SASL_FIELDS and "no server signature ('v')" in said.reason
    said = classify(ValueError("Server sent wrong signature!"), sasl)
    assert said is not None and said.reason.endswith("failed: the SCRAM exchange failed: Server sent wrong signature!")
    assert classify(KeyError("v"), Settings.from_env({})) is None  # not a SCRAM client: nothing known


def test_a_mechanism_the_broker_does_not_take_names_the_mechanism(sasl: Settings) -> None:
    listed = classify(UnsupportedSaslMechanismError(
        "Kafka broker does not support SCRAM-SHA-512 sasl mechanism. Enabled mechanisms are: ['PLAIN']"), sasl)
    assert listed == Refusal("the broker does not take SASL mechanism SCRAM-SHA-512 (UNSUPPORTED_SASL_MECHANISM, it "
                             "takes ['PLAIN'])", ("RTT_KAFKA_SASL_MECHANISM", "RTT_KAFKA_SECURITY_PROTOCOL"))
    coded = classify(UnsupportedSaslMechanismError("<AIOKafkaConnection host=k port=9093>"), sasl)  # the error code
    assert coded is not None and coded.reason.endswith("(UNSUPPORTED_SASL_MECHANISM)")
    assert UnsupportedSaslMechanismError.errno == 33


def test_an_illegal_sasl_state_names_the_security_protocol(sasl: Settings) -> None:
    said = classify(IllegalSaslStateError("<AIOKafkaConnection host=k port=9093>"), sasl)
    assert said is not None and said.fields == ("RTT_KAFKA_SECURITY_PROTOCOL",)
    assert "ILLEGAL_SASL_STATE" in said.reason and "RTT_KAFKA_SECURITY_PROTOCOL is SASL_SSL" in said.reason
    assert IllegalSaslStateError.errno == 34


def test_the_reason_a_closed_connection_carries_is_read(sasl: Settings) -> None:
    said = classify(closed_by(SaslAuthenticationFailed("bad password")), sasl)
    assert said is not None and said.fields == SASL_FIELDS and said.reason.endswith("failed: bad password")


def test_certificate_failures_name_the_ca_file_or_the_host_name(sasl: Settings) -> None:
    unknown_ca = ssl_error(ssl.SSLCertVerificationError, "CERTIFICATE_VERIFY_FAILED", verify_code=20,
                           verify_message="unable to get local issuer certificate")
    said = classify(unknown_ca, sasl)
    assert said == Refusal("TLS: the broker's certificate was not verified: unable to get local issuer certificate",
                           ("RTT_KAFKA_SSL_CAFILE",),
                           "the CA that signed the broker's certificate; now unset: the system's CAs")
    mismatch = ssl_error(ssl.SSLCertVerificationError, "CERTIFICATE_VERIFY_FAILED", verify_code=62,
                         verify_message="Hostname mismatch, certificate is not valid for 'k'.")
    said = classify(mismatch, sasl)
    assert said is not None and said.fields == ("RTT_KAFKA_BOOTSTRAP",) and "Hostname mismatch" in said.reason


@pytest.mark.parametrize(("code", "message"), [(9, "certificate is not yet valid"), (10, "certificate has expired")])
def test_a_certificate_out_of_its_dates_is_waited_for(code: int, message: str, sasl: Settings) -> None:
    # the broker renews it, or this clock is a moment behind one just issued: no setting here to fix
    out_of_dates = ssl_error(ssl.SSLCertVerificationError, "CERTIFICATE_VERIFY_FAILED", verify_code=code,
                             verify_message=message)
    assert classify(out_of_dates, sasl) is None
    assert classify(closed_by(out_of_dates), sasl) is None


@pytest.mark.parametrize(("reason", "fields"), [
    ("WRONG_VERSION_NUMBER", ("RTT_KAFKA_SECURITY_PROTOCOL",)),
    ("TLSV13_ALERT_CERTIFICATE_REQUIRED", ("RTT_KAFKA_SSL_CERTFILE", "RTT_KAFKA_SSL_KEYFILE")),
    ("SSLV3_ALERT_BAD_CERTIFICATE", ("RTT_KAFKA_SSL_CERTFILE", "RTT_KAFKA_SSL_KEYFILE")),
    ("TLSV1_ALERT_PROTOCOL_VERSION", ("RTT_KAFKA_SECURITY_PROTOCOL",)),
])
def test_tls_errors_that_cannot_pass_name_their_setting(reason: str, fields: tuple[str, ...], sasl: Settings) -> None:
    said = classify(ssl_error(ssl.SSLError, reason), sasl)
    assert said is not None and said.fields == fields and said.reason.startswith(f"TLS: {reason}: ")


@pytest.mark.parametrize("error", [
    ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 9093)"),
    socket.gaierror(-2, "Name or service not known"),
    TimeoutError(),
    KafkaConnectionError("Connection at k:9093 closed"),
    closed_by(asyncio.IncompleteReadError(b"", 4)),
    ssl_error(ssl.SSLEOFError, "UNEXPECTED_EOF_WHILE_READING"),
    ssl_error(ssl.SSLError, "DECRYPTION_FAILED_OR_BAD_RECORD_MAC"),
], ids=["refused", "unresolved", "timeout", "closed", "closed-mid-read", "tls-eof", "tls-other"])
def test_what_may_pass_is_no_refusal(error: BaseException, sasl: Settings) -> None:
    assert classify(error, sasl) is None


class Checks:
    """A check that fails with ``errors`` in turn (None: passes), and the waits between them."""

    def __init__(self, errors: Sequence[TopicError | None]) -> None:
        self.errors = list(errors)
        self.tries = 0
        self.slept: list[float] = []

    async def check(self, _settings: Settings, _topics: Sequence[str]) -> None:
        self.tries += 1
        error = self.errors.pop(0)
        if error is not None:
            raise error

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


REFUSED = KafkaRefused("cannot use Kafka at k:9093 (RTT_KAFKA_BOOTSTRAP): TLS: the broker's certificate was not "
                       "verified: self-signed certificate; check RTT_KAFKA_SSL_CAFILE: waiting would not change "
                       "it")
UNREACHABLE = TopicError("cannot reach Kafka at k:9093 (RTT_KAFKA_BOOTSTRAP): KafkaConnectionError: refused")


@pytest.mark.parametrize("bound_s", [0.0, 60.0], ids=["unbounded", "bounded"])
def test_the_wait_does_not_wait_for_a_refusal(bound_s: float) -> None:
    settings = Settings.from_env({}, kafka_bootstrap="k:9093", kafka_start_wait_s=bound_s)
    checks = Checks([UNREACHABLE, REFUSED, None])  # unreachable first (not up yet), then a setting to fix
    reasons: list[str | None] = []
    with pytest.raises(KafkaRefused) as caught:
        asyncio.run(wait_reachable(settings, service="test", check=checks.check, sleep=checks.sleep,
                                   waiting=reasons.append))
    assert str(caught.value) == str(REFUSED)
    assert checks.tries == 2 and len(checks.slept) == 1  # the wait after the unreachable try only
    assert reasons == [str(UNREACHABLE)]
