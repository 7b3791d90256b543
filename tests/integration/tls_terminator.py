"""TLS in front of the embedded broker, for the transport-security test.

Tansu 0.6 parses ``--cert``/``--key`` but never wraps its listener in TLS (tansu-broker/src/broker.rs at
v0.6.0 builds a ``TlsAcceptor`` and drops it; clap puts both flags in one group, so they cannot even be
given together). :class:`TlsFront` terminates TLS on its own port and relays plain bytes to a Tansu
started with that port as its advertised listener, so every client connection — bootstrap and the
broker connections the metadata points at — goes through TLS, with the client certificate required
when ``mutual``. :func:`make_certificates` writes a throwaway CA, a server certificate for 127.0.0.1 and
a client certificate signed by the CA (``cryptography``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from app.kafka.embedded import broker_binary, free_port


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def make_certificates(directory: Path) -> dict[str, Path]:
    """``ca``, ``server_cert``, ``server_key``, ``client_cert``, ``client_key`` PEM files in ``directory``."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("rttsched test CA")).issuer_name(_name("rttsched test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    out = {"ca": directory / "ca.pem"}
    out["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for who, usage in (("server", ExtendedKeyUsageOID.SERVER_AUTH), ("client", ExtendedKeyUsageOID.CLIENT_AUTH)):
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(_name(f"rttsched test {who}")).issuer_name(ca.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if who == "server":
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        out[f"{who}_cert"], out[f"{who}_key"] = directory / f"{who}.pem", directory / f"{who}-key.pem"
        out[f"{who}_cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(out[f"{who}_key"], key)
    return out


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class TlsFront:
    """Tansu on a private port, reachable only through TLS on :attr:`port` (a thread runs the relay)."""

    def __init__(self, certs: dict[str, Path], mutual: bool = True) -> None:
        self.certs = certs
        self.port, self.inner = free_port(), free_port()
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(certs["server_cert"], certs["server_key"])
        if mutual:
            self.context.verify_mode = ssl.CERT_REQUIRED
            self.context.load_verify_locations(certs["ca"])
        self.handshakes = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _serve(self) -> asyncio.Server:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.handshakes += 1
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.inner)
            except OSError:
                writer.close()
                return
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))

        return await asyncio.start_server(handle, "127.0.0.1", self.port, ssl=self.context)

    def start(self) -> TlsFront:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(10)
        inner, outer = f"tcp://127.0.0.1:{self.inner}", f"tcp://127.0.0.1:{self.port}"
        self._proc = subprocess.Popen([broker_binary(), "broker", "--listener-url", inner,
                                       "--advertised-listener-url", outer], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True,
                                      env={**os.environ, "RUST_LOG": "warn"})
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.inner)) == 0:
                    return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("the embedded broker behind the TLS front did not start")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
