"""HTTPS: RTT_EXTENDER_TLS_CERT / RTT_EXTENDER_TLS_KEY serve the same routes over TLS; bad files fail at start."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import ssl
from pathlib import Path

import aiohttp
import orjson
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from extender_fixtures import fixture, make_service

from app.config import Settings
from app.errors import ConfigError
from app.extender.options import ExtenderOptions
from app.extender.server import running, tls_context


def self_signed(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp / "tls.crt", tmp / "tls.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


async def test_https_serves_the_verbs(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    service = make_service(tls_cert=str(cert), tls_key=str(key))
    trust = ssl.create_default_context(cafile=str(cert))
    async with running(service, "127.0.0.1", 0) as server:
        assert server.url.startswith("https://127.0.0.1:")
        async with aiohttp.ClientSession(base_url=server.url, connector=aiohttp.TCPConnector(ssl=trust)) as session:
            resp = await session.post("/prioritize", data=orjson.dumps(fixture("args_names_gctf.json")))
            assert resp.status == 200 and (await resp.json())[0] == {"Host": "gpu-4090-1", "Score": 10}
        async with aiohttp.ClientSession() as plain:  # plain HTTP on the TLS port gets nothing served
            with pytest.raises(aiohttp.ClientError):
                await plain.get(server.url.replace("https", "http") + "/healthz")


def test_tls_settings_fail_at_start_naming_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        Settings.from_env({"RTT_EXTENDER_TLS_CERT": "/etc/x.crt"})
    assert exc.value.field == "RTT_EXTENDER_TLS_KEY"
    cert, key = self_signed(tmp_path)
    options = ExtenderOptions.from_settings(Settings.from_env({}))
    with pytest.raises(ConfigError) as exc:
        tls_context(dataclasses.replace(options, tls_cert=str(cert), tls_key=str(tmp_path / "missing.key")))
    assert exc.value.field == "RTT_EXTENDER_TLS_KEY"
    with pytest.raises(ConfigError) as exc:
        tls_context(dataclasses.replace(options, tls_cert=str(key), tls_key=str(key)))  # a key is no certificate
    assert exc.value.field == "RTT_EXTENDER_TLS_CERT"
