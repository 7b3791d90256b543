"""``rttsched publish`` and a message Kafka refuses for good, against the real embedded broker: it goes to
dead-letters with the reason ``refused_by_kafka`` and its input line, the lines around it are published, and the
summary says how many were dead-lettered. Before, it was dropped after one error line -- and the messages after
it in the same batch were dropped with it, refused by the same error.

A node-metrics value of exactly the contracts' 1 MiB (its stale list padded) is what Kafka refuses:
with the record's key and overhead it is larger than the producer's maximum request size, Kafka's default."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import uuid
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from app.cli.main import main
from app.config import Settings
from app.contracts import decode, encode
from app.contracts.codec import MAX_MESSAGE_BYTES
from app.contracts.dead import MAX_RAW_BYTES

pytestmark = pytest.mark.integration


def scrape(node: str, size: int = 0) -> dict[str, Any]:
    """A node-metrics value; with ``size``, one whose encoding is exactly that many bytes: its ``stale`` list
    padded with group names (a scrape carries at most 512 metrics, some 100 KB: no metrics map reaches 1 MiB)."""
    value: dict[str, Any] = {"node": node, "ts": 1_796_208_576.0, "node_class": "cpu", "gpu_model": None,
                             "metrics": {"rtt_up": 1.0}, "stale": []}
    if size:
        # each item costs its quoted name and a comma (one comma fewer than items): "gpu" 6, "node" 7 with it
        target = size - len(orjson.dumps(value)) + 1
        sevens = target % 6  # 7 * sevens is target modulo 6: the rest in sixes
        value["stale"] = ["node"] * sevens + ["gpu"] * ((target - 7 * sevens) // 6)
        assert len(orjson.dumps(value)) == size  # as encode() writes it
    return value


async def values(settings: Settings, topic: str, n: int, timeout_s: float = 20.0) -> list[Any]:
    """The first ``n`` messages of the contract ``topic`` (fewer when no more came within ``timeout_s``)."""
    consumer = AIOKafkaConsumer(settings.topic(topic), bootstrap_servers=settings.bootstrap_servers,
                                auto_offset_reset="earliest", enable_auto_commit=False,
                                fetch_max_bytes=8 << 20, max_partition_fetch_bytes=8 << 20)
    await consumer.start()
    out: list[Any] = []
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(out) < n and loop.time() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            out.extend(m for msgs in batch.values() for m in msgs)
        return out
    finally:
        await consumer.stop()


def three_scrapes(tmp_path: Any) -> tuple[Any, bytes]:
    """A file of three node-metrics lines, the second too large for Kafka; and that one's encoded value."""
    huge = scrape("worker-2", size=MAX_MESSAGE_BYTES)
    path = tmp_path / "scrapes.jsonl"
    path.write_text("\n".join(json.dumps(v) for v in (scrape("worker-1"), huge, scrape("worker-3"))) + "\n")
    return path, encode("node-metrics", huge)


def published(settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
              *args: str) -> tuple[int, str, str]:
    """``rttsched publish <args>`` on ``settings``' broker and prefix: its exit status, stdout and stderr (no
    traceback in it)."""
    monkeypatch.setenv("RTT_KAFKA_BOOTSTRAP", settings.kafka_bootstrap)
    monkeypatch.setenv("RTT_TOPIC_PREFIX", settings.topic_prefix)
    rc = main(["publish", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return rc, out, err


def the_dead_letter(settings: Settings) -> tuple[Any, dict[str, Any]]:
    """The one message on dead-letters, and its decoded value; worker-1 and worker-3 published beside it."""
    kept = asyncio.run(values(settings, "node-metrics", 3, timeout_s=5.0))
    assert sorted(m.key for m in kept) == [b"worker-1", b"worker-3"]
    [letter] = asyncio.run(values(settings, "dead-letters", 1))
    return letter, decode("dead-letters", letter.value, strict=True)


def test_a_message_kafka_refuses_for_good_goes_to_dead_letters_and_the_others_are_published(
        kafka_settings: Settings, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    path, value = three_scrapes(tmp_path)
    # no --dead-letters: a refused message is kept anyway
    rc, out, err = published(kafka_settings, monkeypatch, capsys, "node-metrics", str(path))
    assert rc == 1, (rc, out, err)  # not lost (3): kept on dead-letters, as an invalid line would be
    assert "Kafka refused 1 message(s) for good" in err and "MessageSizeTooLarge" in err, err
    assert f"from {path}:2 on: they go to dead-letters (reason refused_by_kafka)" in err, err
    assert "2 message(s), 0 invalid record(s), 1 refused by Kafka for good (sent to dead-letters)" in out, out

    letter, dl = the_dead_letter(kafka_settings)
    assert letter.key == kafka_settings.topic("node-metrics").encode()
    assert (dl["topic"], dl["partition"], dl["offset"], dl["reason"], dl["key"]) == (
        kafka_settings.topic("node-metrics"), -1, 2, "refused_by_kafka", "worker-2")
    assert base64.b64decode(dl["raw"]) == value[:MAX_RAW_BYTES]  # its first bytes; the size and digest said
    assert dl["error"].startswith("refused_by_kafka: refused for good ([Error 10] MessageSizeTooLargeError"), dl
    assert f"sha256 of the whole value {hashlib.sha256(value).hexdigest()}" in dl["error"], dl
    assert f"raw cut to its first {MAX_RAW_BYTES:,} bytes (of {len(value):,})" in dl["error"], dl


def test_without_a_dead_letters_topic_a_refused_message_is_said_not_sent(
        kafka_bootstrap: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """No dead-letters topic under the prefix: none is auto-created by writing to it; the message is not sent,
    exit status 3, and the others are still published."""
    settings = Settings.from_env({}, kafka_bootstrap=kafka_bootstrap, topic_prefix=f"r{uuid.uuid4().hex[:10]}-")

    async def node_metrics_only() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap_servers)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(settings.topic("node-metrics"), 1, 1)])
        finally:
            await admin.close()

    asyncio.run(node_metrics_only())
    path, _ = three_scrapes(tmp_path)
    rc, out, err = published(settings, monkeypatch, capsys, "node-metrics", str(path))
    assert rc == 3, (rc, out, err)
    assert f"from {path}:2 on; not sent again, nor dead-lettered: no topic {settings.topic('dead-letters')}" in err
    assert "1 message(s) refused by Kafka for good, not sent" in err, err
    assert "2 message(s), 0 invalid record(s)" in out and "refused" not in out, out
    kept = asyncio.run(values(settings, "node-metrics", 3, timeout_s=5.0))
    assert sorted(m.key for m in kept) == [b"worker-1", b"worker-3"]


def test_a_value_over_the_contracts_size_is_dead_lettered_as_too_large(
        kafka_settings: Settings, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """One byte more than the contracts allow is no message at all: an invalid line (``too_large``), dead-lettered
    with ``--dead-letters``, the others published. Before, publish ended (exit status 2) and sent nothing more."""
    huge = scrape("worker-2", size=MAX_MESSAGE_BYTES + 1)
    line = json.dumps(huge)
    path = tmp_path / "scrapes.jsonl"
    path.write_text("\n".join([json.dumps(scrape("worker-1")), line, json.dumps(scrape("worker-3"))]) + "\n")
    rc, out, err = published(kafka_settings, monkeypatch, capsys, "node-metrics", str(path), "--dead-letters")
    assert rc == 1, (rc, out, err)
    assert f"{path}:2: too_large: {MAX_MESSAGE_BYTES + 1} bytes > {MAX_MESSAGE_BYTES}" in err, err
    assert "2 message(s), 1 invalid record(s) (sent to dead-letters)" in out, out
    _, dl = the_dead_letter(kafka_settings)
    assert (dl["offset"], dl["reason"]) == (2, "too_large")
    assert base64.b64decode(dl["raw"]) == line.encode()[:MAX_RAW_BYTES]
