"""A broker that turns the client away for good ends the start at once with one line naming the settings to check,
on real listeners: the embedded broker, and the same broker behind TLS (:class:`tls_terminator.TlsFront`).

A certificate signed by another CA than ``RTT_KAFKA_SSL_CAFILE``'s, a TLS client on the plaintext listener, a
plaintext client on the TLS one, and a SASL mechanism the broker does not take (Tansu 0.6 answers a SCRAM handshake on
its listener without authentication with UNSUPPORTED_SASL_MECHANISM) are :class:`~app.kafka.admin.KafkaRefused`, which
:func:`~app.kafka.admin.wait_reachable` does not wait for, even unbounded (``RTT_KAFKA_START_WAIT_S`` 0). Before, each
was ``cannot reach Kafka at … Unable to bootstrap …`` and the services waited for ever. A refused connection and a
name that does not resolve are still waited for. ``rttsched trainer``, ``worker`` and ``bridge`` with the wrong CA
exit with code 2 and the one line, no traceback, in seconds (measured: 2-5 s, the imports included). On the
broker started with ``--authentication`` (SASL/SCRAM required), a client without SASL is refused, the trainer's line
alone (aiokafka's ``Unable to request metadata`` WARNING is not printed before it), and a SCRAM user it does not know
is a failed authentication (before: ``KeyError: 'v'``, exit code 1, from aiokafka's SCRAM client).
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from tls_terminator import TlsFront, make_certificates

from app.config import Settings
from app.kafka.admin import KafkaRefused, TopicError, check_reachable, wait_reachable
from app.kafka.embedded import broker_binary, free_port
from app.kafka.refusal import refusal

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
EXIT_S = 60.0  # a service's imports and its first try, on a loaded machine (measured: 3-5 s)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TlsFront, dict[str, Path], dict[str, Path]]]:
    """The embedded broker behind TLS (no client certificate asked), its certificates, and another CA's."""
    certs = make_certificates(tmp_path_factory.mktemp("ca"))
    other = make_certificates(tmp_path_factory.mktemp("other-ca"))
    front = TlsFront(certs, mutual=False).start()
    try:
        yield front, certs, other
    finally:
        front.stop()


def refused(settings: Settings, bound_s: float = 30.0) -> tuple[str, float]:
    """The :class:`KafkaRefused` line of an unbounded :func:`wait_reachable`, and the seconds it took; fails when it
    still waits after ``bound_s``."""
    async def run() -> tuple[str, float]:
        started = time.monotonic()

        async def no_sleep(_: float) -> None:  # the waits between tries would only slow a failure down
            await asyncio.sleep(0)

        try:
            async with asyncio.timeout(bound_s):
                await wait_reachable(settings, service="test", sleep=no_sleep)
        except KafkaRefused as exc:
            return str(exc), time.monotonic() - started
        except TimeoutError:
            pytest.fail(f"still waiting after {bound_s:g} s")
        pytest.fail("the broker answered")

    assert settings.kafka_start_wait_s == 0
    return asyncio.run(run())


def test_the_right_ca_passes_and_another_ca_is_refused_at_once(tls: tuple[TlsFront, dict[str, Path],
                                                                           dict[str, Path]]) -> None:
    front, certs, other = tls
    good = Settings.from_env({}, kafka_bootstrap=front.bootstrap, kafka_security_protocol="SSL",
                             kafka_ssl_cafile=str(certs["ca"]))
    asyncio.run(check_reachable(good))  # the listener itself is fine
    bad = Settings.from_env({}, kafka_bootstrap=front.bootstrap, kafka_security_protocol="SSL",
                            kafka_ssl_cafile=str(other["ca"]))
    line, took = refused(bad)
    assert line.startswith(f"cannot use Kafka at {front.bootstrap} (RTT_KAFKA_BOOTSTRAP): TLS: the broker's "
                           "certificate was not verified: "), line
    assert f"check RTT_KAFKA_SSL_CAFILE (the CA that signed the broker's certificate; now {other['ca']})" in line
    assert "\n" not in line and took < 5.0


def test_an_address_not_there_beside_one_that_refuses_is_still_a_refusal(tls: tuple[TlsFront, dict[str, Path],
                                                                                       dict[str, Path]]) -> None:
    front, _, other = tls
    bootstrap = f"127.0.0.1:{free_port()},{front.bootstrap}"  # the first refuses connections: not up, or gone
    line, _ = refused(Settings.from_env({}, kafka_bootstrap=bootstrap, kafka_security_protocol="SSL",
                                        kafka_ssl_cafile=str(other["ca"])))
    assert line.startswith(f"cannot use Kafka at {bootstrap} (RTT_KAFKA_BOOTSTRAP): TLS: the broker's certificate was "
                           "not verified: "), line


def test_a_plaintext_client_on_the_tls_listener_is_refused(tls: tuple[TlsFront, dict[str, Path],
                                                                      dict[str, Path]]) -> None:
    front, _, _ = tls
    line, took = refused(Settings.from_env({}, kafka_bootstrap=front.bootstrap))
    assert (f"{front.bootstrap} speaks TLS, RTT_KAFKA_SECURITY_PROTOCOL is PLAINTEXT; check "
            "RTT_KAFKA_SECURITY_PROTOCOL (SSL or SASL_SSL for that listener)") in line, line
    assert took < 5.0


def test_a_tls_client_on_the_plaintext_listener_is_refused(kafka_bootstrap: str) -> None:
    # the TLS handshake with a plaintext Kafka listener hangs until the client's request timeout (10 s)
    line, took = refused(Settings.from_env({}, kafka_bootstrap=kafka_bootstrap, kafka_security_protocol="SSL"))
    assert (f"{kafka_bootstrap} answers Kafka without TLS, RTT_KAFKA_SECURITY_PROTOCOL is SSL; check "
            "RTT_KAFKA_SECURITY_PROTOCOL (PLAINTEXT or SASL_PLAINTEXT for that listener)") in line, line
    assert took < 20.0


def test_a_sasl_mechanism_the_broker_does_not_take_is_refused(kafka_bootstrap: str, tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("secret")
    line, took = refused(Settings.from_env(
        {}, kafka_bootstrap=kafka_bootstrap, kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="SCRAM-SHA-256", kafka_sasl_username="alice", kafka_sasl_password_file=str(password)))
    assert ("the broker does not take SASL mechanism SCRAM-SHA-256 (UNSUPPORTED_SASL_MECHANISM); check "
            "RTT_KAFKA_SASL_MECHANISM") in line, line
    assert "secret" not in line and took < 5.0


@pytest.mark.parametrize("bootstrap", [f"127.0.0.1:{free_port()}", "rttsched-no-such-broker.invalid:9092"],
                         ids=["refused", "unresolved"])
def test_a_broker_not_there_is_still_waited_for(bootstrap: str) -> None:
    settings = Settings.from_env({}, kafka_bootstrap=bootstrap)
    with pytest.raises(TopicError) as caught:
        asyncio.run(check_reachable(settings))
    assert not isinstance(caught.value, KafkaRefused)
    assert str(caught.value).startswith(f"cannot reach Kafka at {bootstrap} (RTT_KAFKA_BOOTSTRAP): ")

    tries: list[float] = []

    async def count(_: float) -> None:
        tries.append(time.monotonic())
        if len(tries) >= 3:
            raise asyncio.CancelledError  # three waits between tries: it waits, as before

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(wait_reachable(settings, service="test", sleep=count))
    assert len(tries) == 3


@pytest.mark.parametrize("argv", [["trainer"], ["worker"], ["bridge", "--target", "node=n1,url=http://127.0.0.1:9/m"]],
                         ids=["trainer", "worker", "bridge"])
def test_a_service_with_another_ca_exits_2_with_one_line(argv: list[str], tls: tuple[TlsFront, dict[str, Path],
                                                                                  dict[str, Path]],
                                                         tmp_path: Path) -> None:
    front, _, other = tls
    service = argv[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTT_") and k != "REDIS_URL"}
    env.update(RTT_KAFKA_BOOTSTRAP=front.bootstrap, RTT_KAFKA_SECURITY_PROTOCOL="SSL",
               RTT_KAFKA_SSL_CAFILE=str(other["ca"]), RTT_TOPIC_PREFIX=f"r{uuid.uuid4().hex[:8]}-",
               RTT_MODELS_DIR=str(tmp_path / "models"), RTT_WORKER_DATADIR=str(tmp_path / "faust"),
               RTT_METRICS_HOST="127.0.0.1", RTT_METRICS_PORT=str(free_port()))  # RTT_KAFKA_START_WAIT_S unset: 0
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "app.cli.main", *argv], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=EXIT_S)
    took = time.monotonic() - started
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if " INFO " not in line]  # the metrics port's INFO line
    assert done.stdout == ""
    assert errors == [f"rttsched {service}: error: cannot use Kafka at {front.bootstrap} (RTT_KAFKA_BOOTSTRAP): TLS: "
                      f"the broker's certificate was not verified: certificate signature failure; check "
                      f"RTT_KAFKA_SSL_CAFILE (the CA that signed the broker's certificate; now {other['ca']}): "
                      "waiting would not change it"], done.stderr
    assert "waiting for Kafka" not in done.stdout + done.stderr and "Traceback" not in done.stdout
    print(f"{service}: exit 2 after {took:.1f} s")


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def sasl_listener() -> Iterator[str]:
    """The embedded broker with ``--authentication`` (SASL/SCRAM required): its bootstrap address."""
    port = free_port()
    proc = subprocess.Popen([broker_binary(), "broker", "--listener-url", f"tcp://127.0.0.1:{port}",
                             "--advertised-listener-url", f"tcp://127.0.0.1:{port}", "--authentication"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "RUST_LOG": "warn"})
    try:
        deadline = time.monotonic() + 20
        while not listening(port) and time.monotonic() < deadline:  # (its Metadata needs an authenticated client)
            time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(5)


def test_a_client_without_sasl_on_a_sasl_listener_is_refused(sasl_listener: str) -> None:
    line, took = refused(Settings.from_env({}, kafka_bootstrap=sasl_listener))
    assert (f"{sasl_listener} closed the connection at the first request after ApiVersions and offers SASL "
            "(SCRAM-SHA-512), RTT_KAFKA_SECURITY_PROTOCOL is PLAINTEXT; check RTT_KAFKA_SECURITY_PROTOCOL, "
            "RTT_KAFKA_SASL_MECHANISM (SASL_PLAINTEXT or SASL_SSL, with the RTT_KAFKA_SASL_* settings)") in line, line
    assert took < 5.0


def test_a_trainer_without_sasl_on_a_sasl_listener_exits_2_with_one_line(sasl_listener: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTT_") and k != "REDIS_URL"}
    env.update(RTT_KAFKA_BOOTSTRAP=sasl_listener, RTT_MODELS_DIR=str(tmp_path / "models"),
               RTT_METRICS_HOST="127.0.0.1", RTT_METRICS_PORT=str(free_port()))
    done = subprocess.run([sys.executable, "-m", "app.cli.main", "trainer"], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=EXIT_S)
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if " INFO " not in line]  # aiokafka's WARNING is not there
    assert len(errors) == 1 and errors[0].startswith(
        f"rttsched trainer: error: cannot use Kafka at {sasl_listener} (RTT_KAFKA_BOOTSTRAP): {sasl_listener} closed "
        "the connection at the first request after ApiVersions and offers SASL"), done.stderr


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_scram_user_the_broker_does_not_know_is_refused(mechanism: str, sasl_listener: str, tmp_path: Path) -> None:
    # Tansu answers the failed exchange with a SCRAM error (e=…) in its last message, which aiokafka's client reads as a
    # missing signature (KeyError 'v'); a Kafka broker answers SASL_AUTHENTICATION_FAILED (tests/unit/kafka)
    password = tmp_path / "password"
    password.write_text("not-the-password")
    line, took = refused(Settings.from_env(
        {}, kafka_bootstrap=sasl_listener, kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_mechanism=mechanism,
        kafka_sasl_username="mallory", kafka_sasl_password_file=str(password)))
    assert line.startswith(f"cannot use Kafka at {sasl_listener} (RTT_KAFKA_BOOTSTRAP): SASL authentication as "
                           f"'mallory' with {mechanism} failed: the broker's last SCRAM message has no server "
                           "signature ('v'): a SCRAM error such as unknown-user or invalid-proof; check "
                           "RTT_KAFKA_SASL_USERNAME, RTT_KAFKA_SASL_PASSWORD_FILE, RTT_KAFKA_SASL_MECHANISM: "
                           "waiting would not change it"), line
    assert "not-the-password" not in line and took < 5.0


class SilentTls:
    """A TLS listener that completes the handshake and then neither reads nor writes (a close_notify from the client
    is never answered); a connection whose handshake fails is closed."""

    def __init__(self, certs: dict[str, Path]) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(certs["server_cert"], certs["server_key"])
        self.server = socket.create_server(("127.0.0.1", 0))
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.server.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:  # closed: the test is over
                return
            try:
                self.held.append(self.context.wrap_socket(conn, server_side=True))
            except (OSError, ssl.SSLError):  # no TLS from the client
                conn.close()

    def __enter__(self) -> SilentTls:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown(socket.SHUT_RDWR)  # wakes the accept under way
        self.server.close()
        self.thread.join(5)
        for held in self.held:
            held.close()


def test_the_tls_probe_closes_its_connection_before_it_returns(tls: tuple[TlsFront, dict[str, Path],
                                                                        dict[str, Path]]) -> None:
    _, certs, _ = tls
    # a client without TLS on a TLS listener: the probe that finds TLS there closes its connection at once, not
    # after a close_notify exchange the listener may never answer (the process exits right after the refusal)
    with SilentTls(certs) as listener:
        settings = Settings.from_env({}, kafka_bootstrap=listener.bootstrap)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            said = asyncio.run(refusal(settings))
            gc.collect()
        assert said is not None and f"{listener.bootstrap} speaks TLS" in said.reason, said
        unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
        assert unclosed == []
