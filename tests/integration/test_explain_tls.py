"""``rttsched explain`` against a real extender that serves HTTPS (RTT_EXTENDER_TLS_CERT / RTT_EXTENDER_TLS_KEY):
by default, beside the extender (its settings in the environment, as in its pod), it asks https:// and trusts the
very certificate the extender serves; ``--ca-file`` verifies another URL against a CA; every failure is one line,
exit code 2.

Two certificates: a self-signed one, and one a CA issued (served with its chain, as cert-manager writes them). Both
name ``localhost`` only, not 127.0.0.1, as a Service's certificate names the Service.
"""

from __future__ import annotations

import datetime
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from app.cli.main import main

REPO = Path(__file__).resolve().parents[2]
EXPLAIN = ["explain", "--app", "gCTF", "--nodes", "gpu-1,cpu-1", "--json", "--timeout", "20"]


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Certificate | None,
                 issuer_key: ec.EllipticCurvePrivateKey | None, ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (x509.CertificateBuilder().subject_name(name)
               .issuer_name(issuer.subject if issuer is not None else name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
    return builder.sign(issuer_key or key, hashes.SHA256())


@dataclass
class Served:
    port: int
    cert: Path  # what RTT_EXTENDER_TLS_CERT names (the chain, leaf first)
    key: Path
    ca: Path  # what a client verifies against: the CA, or the self-signed certificate itself
    other_ca: Path  # a CA that issued nothing the extender serves


def _write_pki(tmp: Path, kind: str) -> tuple[Path, Path, Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    other_key = ec.generate_private_key(ec.SECP256R1())
    other = _certificate("some other CA", other_key, None, None, ca=True)
    cert_file, key_file, ca_file, other_file = (tmp / n for n in ("tls.crt", "tls.key", "ca.crt", "other-ca.crt"))
    if kind == "self-signed":
        leaf = _certificate("localhost", key, None, None, ca=False)
        cert_file.write_bytes(_pem(leaf))
        ca_file.write_bytes(_pem(leaf))
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = _certificate("rttsched test CA", ca_key, None, None, ca=True)
        leaf = _certificate("localhost", key, ca, ca_key, ca=False)
        cert_file.write_bytes(_pem(leaf) + _pem(ca))
        ca_file.write_bytes(_pem(ca))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    other_file.write_bytes(_pem(other))
    return cert_file, key_file, ca_file, other_file


def _wait_served(port: int, ca: Path, timeout_s: float = 60.0) -> None:
    """Until the service has taken over the port from the start-up handler (which has no /explain yet)."""
    trust = ssl.create_default_context(cafile=str(ca))
    trust.check_hostname = False
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/openapi.json", timeout=5, context=trust):
                return
        except urllib.error.HTTPError as exc:
            if exc.code != 503 or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


@pytest.fixture(scope="module", params=["self-signed", "ca-issued"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A real ``rttsched extender`` serving HTTPS on 127.0.0.1 (no Kafka or Redis: it answers with what it has)."""
    tmp = tmp_path_factory.mktemp(f"explain-tls-{request.param}")
    cert, key, ca, other = _write_pki(tmp, request.param)
    env = {**os.environ, "RTT_EXTENDER_HOST": "127.0.0.1", "RTT_EXTENDER_PORT": "0",
           "RTT_EXTENDER_TLS_CERT": str(cert), "RTT_EXTENDER_TLS_KEY": str(key),
           "RTT_KAFKA_BOOTSTRAP": "127.0.0.1:1", "PYTHONPATH": str(REPO)}
    env.pop("REDIS_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", "extender", "--no-redis", "--no-publish"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the first line: listening, or why not
        m = re.match(r"rttsched extender: listening on https://127\.0\.0\.1:(\d+) ", line)
        assert m, line + (proc.stdout.read() if proc.poll() is not None else "")
        _wait_served(int(m.group(1)), ca)
        yield Served(int(m.group(1)), cert, key, ca, other)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def beside(served: Served, monkeypatch: pytest.MonkeyPatch) -> Served:
    """The extender's own settings in the environment, as in its pod."""
    monkeypatch.setenv("RTT_EXTENDER_PORT", str(served.port))
    monkeypatch.setenv("RTT_EXTENDER_TLS_CERT", str(served.cert))
    monkeypatch.setenv("RTT_EXTENDER_TLS_KEY", str(served.key))
    return served


@pytest.fixture
def elsewhere(served: Served, monkeypatch: pytest.MonkeyPatch) -> Served:
    """No extender settings: a machine that only knows the URL."""
    for name in ("RTT_EXTENDER_PORT", "RTT_EXTENDER_TLS_CERT", "RTT_EXTENDER_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    return served


def _answered(capsys: pytest.CaptureFixture[str]) -> None:
    out = capsys.readouterr()
    assert '"nodes"' in out.out and out.err == "", out.err


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    out = capsys.readouterr()
    assert out.out == "" and "Traceback" not in out.err and len(out.err.splitlines()) == 1, out.err
    return out.err.strip()


def test_beside_the_extender_the_default_url_is_https_and_trusts_its_certificate(beside, capsys):
    assert main(EXPLAIN) == 0
    _answered(capsys)


def test_beside_the_extender_a_server_with_another_certificate_is_refused(beside, monkeypatch, capsys):
    monkeypatch.setenv("RTT_EXTENDER_TLS_CERT", str(beside.other_ca))  # what the server does not serve
    assert main(EXPLAIN) == 2
    line = _error(capsys)
    assert line.startswith(f"rttsched explain: error: cannot verify the certificate of the extender at "
                           f"https://127.0.0.1:{beside.port}: ")
    assert f"it is not the certificate of RTT_EXTENDER_TLS_CERT {beside.other_ca}" in line


def test_a_ca_file_verifies_an_https_url(elsewhere, capsys):
    assert main([*EXPLAIN, "--url", f"https://localhost:{elsewhere.port}", "--ca-file", str(elsewhere.ca)]) == 0
    _answered(capsys)


def test_without_a_ca_file_an_unknown_issuer_is_one_line_naming_the_flag(elsewhere, capsys):
    assert main([*EXPLAIN, "--url", f"https://localhost:{elsewhere.port}"]) == 2
    line = _error(capsys)
    assert line.startswith(f"rttsched explain: error: cannot verify the certificate of the extender at "
                           f"https://localhost:{elsewhere.port}: ")
    assert line.endswith("(give the CA that issued it with --ca-file)")


def test_a_ca_file_that_did_not_issue_it_is_named(elsewhere, capsys):
    assert main([*EXPLAIN, "--url", f"https://localhost:{elsewhere.port}", "--ca-file", str(elsewhere.other_ca)]) == 2
    assert _error(capsys).endswith(f"(no CA of --ca-file {elsewhere.other_ca} issued it)")


def test_a_host_the_certificate_does_not_name_is_said(elsewhere, capsys):
    assert main([*EXPLAIN, "--url", f"https://127.0.0.1:{elsewhere.port}", "--ca-file", str(elsewhere.ca)]) == 2
    line = _error(capsys)
    assert "not valid for '127.0.0.1'" in line and line.endswith("(give --url a name its certificate holds)")


def test_plain_http_to_the_https_port_is_one_line(elsewhere, capsys):
    assert main([*EXPLAIN, "--url", f"http://127.0.0.1:{elsewhere.port}"]) == 2
    line = _error(capsys)
    assert line.startswith(f"rttsched explain: error: cannot reach the extender at http://127.0.0.1:{elsewhere.port}: ")
    assert line.endswith("closes plain HTTP: --url https://...)")


@pytest.mark.parametrize("kind", ["missing", "directory", "not-pem"])
def test_a_ca_file_that_cannot_be_used_is_one_line(kind, elsewhere, tmp_path, capsys):
    path = {"missing": tmp_path / "nope.crt", "directory": tmp_path, "not-pem": tmp_path / "x.crt"}[kind]
    if kind == "not-pem":
        path.write_text("not a certificate\n")
    assert main([*EXPLAIN, "--url", f"https://localhost:{elsewhere.port}", "--ca-file", str(path)]) == 2
    line = _error(capsys)
    said = {"missing": f"cannot read {path}: No such file or directory",
            "directory": f"cannot read {path}: Is a directory",
            "not-pem": f"{path} holds no PEM certificate"}[kind]
    assert line.startswith(f"rttsched explain: error: --ca-file: {said}")


def test_a_ca_file_with_plain_http_is_refused(elsewhere, capsys):
    assert main([*EXPLAIN, "--url", f"http://127.0.0.1:{elsewhere.port}", "--ca-file", str(elsewhere.ca)]) == 2
    assert _error(capsys) == (f"rttsched explain: error: --ca-file: only for an https:// extender "
                              f"(--url is http://127.0.0.1:{elsewhere.port})")
