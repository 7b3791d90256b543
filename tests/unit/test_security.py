"""Transport security and secrets: settings validated at start, passed to every client, never logged."""

from __future__ import annotations

import io
import logging
import ssl
from pathlib import Path

import faust
import pytest

from app.config import Settings
from app.errors import ConfigError
from app.kafka.client import client_options, faust_credentials
from app.masking import SecretFilter, install


def secret(tmp_path: Path, text: str = "s3cr3t-pw\n", name: str = "pw") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_sasl_settings_reach_aiokafka_and_faust(tmp_path: Path) -> None:
    s = Settings.from_env({"RTT_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "RTT_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                           "RTT_KAFKA_SASL_USERNAME": "rtt", "RTT_KAFKA_SASL_PASSWORD_FILE": secret(tmp_path)})
    opts = client_options(s, acks="all")
    assert opts["security_protocol"] == "SASL_PLAINTEXT" and opts["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (opts["sasl_plain_username"], opts["sasl_plain_password"], opts["acks"]) == ("rtt", "s3cr3t-pw", "all")
    assert "ssl_context" not in opts
    creds = faust_credentials(s)
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.username, creds.password, creds.mechanism.value, creds.protocol.value) == (
        "rtt", "s3cr3t-pw", "SCRAM-SHA-512", "SASL_PLAINTEXT")


def test_sasl_ssl_builds_a_verifying_context(tmp_path: Path) -> None:
    s = Settings.from_env({"RTT_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "RTT_KAFKA_SASL_MECHANISM": "PLAIN",
                           "RTT_KAFKA_SASL_USERNAME": "rtt", "RTT_KAFKA_SASL_PASSWORD_FILE": secret(tmp_path)})
    ctx = client_options(s)["ssl_context"]
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert faust_credentials(s).protocol.value == "SASL_SSL"
    assert faust_credentials(Settings.from_env({})) is None


@pytest.mark.parametrize(("env", "field"), [
    ({"RTT_KAFKA_SECURITY_PROTOCOL": "TLS"}, "RTT_KAFKA_SECURITY_PROTOCOL"),
    ({"RTT_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "RTT_KAFKA_SASL_MECHANISM"),
    ({"RTT_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "RTT_KAFKA_SASL_MECHANISM": "PLAIN"}, "RTT_KAFKA_SASL_USERNAME"),
    ({"RTT_KAFKA_SASL_MECHANISM": "GSSAPI"}, "RTT_KAFKA_SASL_MECHANISM"),
    ({"RTT_KAFKA_SSL_CAFILE": "/no/such/ca.pem", "RTT_KAFKA_SECURITY_PROTOCOL": "SSL"}, "RTT_KAFKA_SSL_CAFILE"),
    ({"RTT_REDIS_PASSWORD_FILE": "/no/such/file"}, "RTT_REDIS_PASSWORD_FILE"),
])
def test_bad_security_settings_fail_at_start_naming_the_field(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env(env)
    assert info.value.field == field


def test_tls_files_need_a_tls_protocol_and_a_cert_needs_its_key(tmp_path: Path) -> None:
    pem = secret(tmp_path, "not checked here")
    with pytest.raises(ConfigError, match="RTT_KAFKA_SECURITY_PROTOCOL"):
        Settings.from_env({"RTT_KAFKA_SSL_CAFILE": pem})
    with pytest.raises(ConfigError, match="RTT_KAFKA_SSL_KEYFILE"):
        Settings.from_env({"RTT_KAFKA_SECURITY_PROTOCOL": "SSL", "RTT_KAFKA_SSL_CERTFILE": pem})


def test_redis_password_comes_from_its_file_and_is_masked_everywhere(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    s = Settings.from_env({"REDIS_URL": "redis://redis:6379/0", "RTT_REDIS_PASSWORD_FILE": secret(tmp_path, "p@ss w\n"),
                           "RTT_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "RTT_KAFKA_SASL_MECHANISM": "PLAIN",
                           "RTT_KAFKA_SASL_USERNAME": "u",
                           "RTT_KAFKA_SASL_PASSWORD_FILE": secret(tmp_path, "kafka-pw", "kafka")})
    assert s.redis_client_url == "redis://:p%40ss%20w@redis:6379/0"
    assert s.redis_url == "redis://redis:6379/0"
    assert sorted(s.secrets()) == ["kafka-pw", "p@ss w"]
    log = logging.getLogger("rtt.test.masking")
    flt = SecretFilter(s.secrets())
    handler = caplog.handler
    handler.addFilter(flt)
    try:
        log.warning("connecting to %s with %s", s.redis_client_url, "kafka-pw")
        try:
            raise ValueError("auth failed for p@ss w")
        except ValueError:
            log.exception("boom")
    finally:
        handler.removeFilter(flt)
    text = caplog.text
    assert "p@ss" not in text and "kafka-pw" not in text and "p%40ss" not in text
    assert "redis://:***@redis:6379/0" in text and "auth failed for ***" in text


def test_install_filters_every_root_handler() -> None:
    root = logging.getLogger()
    handler = logging.StreamHandler()
    root.addHandler(handler)
    try:
        flt = install(["x-secret"])
        assert flt in handler.filters
    finally:
        root.removeHandler(handler)


def test_install_again_keeps_one_filter_per_handler_masking_every_secret() -> None:
    """``main()`` run in one process again and again used to add a filter each time (59 after test_cli_flags)."""
    log = logging.getLogger("rtt.test.install")
    log.propagate = False
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    other = logging.Filter("rtt")  # a filter of someone else's stays
    handler.addFilter(other)
    log.addHandler(handler)
    try:
        install(["first-secret"], log)
        install(["first-secret"], log)
        flt = install(["second-secret"], log)
        assert handler.filters == [other, flt]
        log.warning("first-secret and second-secret")
        assert out.getvalue() == "*** and ***\n"
    finally:
        log.removeHandler(handler)
        log.propagate = True
