"""Kafka over TLS (mutual): the settings reach aiokafka and Faust, and nothing without them gets through.

The embedded broker is reachable only through :class:`tls_terminator.TlsFront` (TLS 1.2+, client certificate
required). With ``RTT_KAFKA_SECURITY_PROTOCOL=SSL`` and the CA, client certificate and key files, the
topics are created, a producer and a consumer exchange messages, and a worker subprocess (Faust plus the
intakes) turns node-metrics into node-features. A plaintext client and a TLS client without a client
certificate are refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from tls_terminator import TlsFront, make_certificates

from app.cli.processes import ProcessGroup
from app.config import Settings
from app.kafka.admin import ensure_topics
from app.kafka.client import client_options
from app.sim.scripted import Reader, Sender, start_worker

pytestmark = pytest.mark.integration


@pytest.fixture
def tls(tmp_path: Path) -> tuple[TlsFront, dict[str, Path]]:
    certs = make_certificates(tmp_path)
    front = TlsFront(certs, mutual=True).start()
    try:
        yield front, certs
    finally:
        front.stop()


def tls_settings(front: TlsFront, certs: dict[str, Path], tmp_path: Path) -> Settings:
    return Settings.from_env({}, kafka_bootstrap=front.bootstrap, topic_prefix=f"tls{uuid.uuid4().hex[:8]}-",
                             models_dir=str(tmp_path / "models"), kafka_security_protocol="SSL",
                             kafka_ssl_cafile=str(certs["ca"]), kafka_ssl_certfile=str(certs["client_cert"]),
                             kafka_ssl_keyfile=str(certs["client_key"]))


async def refused(**options: object) -> str:
    producer = AIOKafkaProducer(request_timeout_ms=3000, **options)  # type: ignore[arg-type]
    try:
        await asyncio.wait_for(producer.start(), 15)
    except (KafkaError, TimeoutError, OSError) as exc:
        return type(exc).__name__
    finally:
        await producer.stop()
    return ""


def test_clients_and_a_worker_talk_to_the_broker_over_mutual_tls(tls: tuple[TlsFront, dict[str, Path]],
                                                                 tmp_path: Path) -> None:
    front, certs = tls
    s = tls_settings(front, certs, tmp_path)
    results = asyncio.run(ensure_topics(s))
    assert {r.topic for r in results} >= {s.topic("node-metrics"), s.topic("node-features")}

    node = "gpu-tls-1"
    snap = {"node": node, "ts": time.time(), "node_class": "gpu", "gpu_model": "Tesla M40",
            "metrics": {"nvidia_smi_utilization_gpu": 0.42}}

    async def roundtrip() -> list[dict[str, object]]:
        async with Sender(s) as out, Reader(s, "node-metrics") as back:
            await out.send("node-metrics", snap)
            await out.flush()
            return await back.wait(lambda v: v, 15.0, "the snapshot read back over TLS")  # type: ignore[no-any-return]

    assert asyncio.run(roundtrip())[0]["node"] == node

    with ProcessGroup(tmp_path / "logs") as group:
        start_worker(group, s, "worker", RTT_KAFKA_SECURITY_PROTOCOL="SSL", RTT_KAFKA_SSL_CAFILE=str(certs["ca"]),
                     RTT_KAFKA_SSL_CERTFILE=str(certs["client_cert"]),
                     RTT_KAFKA_SSL_KEYFILE=str(certs["client_key"]))

        async def features() -> list[dict[str, object]]:
            async with Sender(s) as out, Reader(s, "node-features") as feats:
                for k in range(6):
                    await out.send("node-metrics", {**snap, "ts": time.time() + 0.01 * k})
                await out.flush()
                return await feats.wait(lambda v: [f for f in v if f["node"] == node], 40.0,  # type: ignore[no-any-return]
                                        "node-features from the worker over TLS")

        got = asyncio.run(features())
        group.check()
    assert got[-1]["features"]["nvidia_smi_utilization_gpu__mean"] == pytest.approx(0.42)
    assert front.handshakes > 0

    # no way in without TLS, nor with TLS but without a client certificate
    no_cert = dataclasses.replace(s, kafka_ssl_certfile="", kafka_ssl_keyfile="")
    assert asyncio.run(refused(bootstrap_servers=s.bootstrap_servers)) != ""
    assert asyncio.run(refused(**client_options(no_cert))) != ""
