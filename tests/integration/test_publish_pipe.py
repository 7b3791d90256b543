"""``rttsched publish`` as a long-lived pipe, against the real embedded broker: each completion is on the topic
while its input stays open -- it never waits for a batch to fill or for the end of the input."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from app.config import Settings
from app.contracts import decode

pytestmark = pytest.mark.integration

WITHIN_S = 10.0  # a completion written to the pipe is on the topic this soon (the batch is 1000)


def completion(n: int) -> dict[str, Any]:
    return {"task_id": f"pipe-{n}", "app": "upload", "node": "worker-1", "submitted_ts": 10.0 + n,
            "started_ts": 11.0 + n, "finished_ts": 13.5 + n, "rtt_ms": 3500.0, "status": "ok"}


async def take(consumer: AIOKafkaConsumer, n: int, timeout_s: float) -> list[Any]:
    """The next ``n`` records of the consumer's topic, or as many as came within ``timeout_s``."""
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        batch = await consumer.getmany(timeout_ms=200)
        out.extend(m for msgs in batch.values() for m in msgs)
    return out


@contextlib.asynccontextmanager
async def piped(kafka_settings: Settings, *args: str,
                topics: tuple[str, ...] = ("task-completions",)) -> AsyncIterator[tuple[Any, list[AIOKafkaConsumer]]]:
    """``rttsched publish <args> -`` reading an open pipe (the process), and a consumer of each of ``topics`` from
    their start; nodes not checked (no REDIS_URL). The process is killed and the consumers stopped after."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(RTT_KAFKA_BOOTSTRAP=kafka_settings.kafka_bootstrap, RTT_TOPIC_PREFIX=kafka_settings.topic_prefix)
    consumers = [AIOKafkaConsumer(kafka_settings.topic(t), bootstrap_servers=kafka_settings.bootstrap_servers,
                                  auto_offset_reset="earliest", enable_auto_commit=False) for t in topics]
    for c in consumers:
        await c.start()
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", "publish", *args, "-"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert proc.stdin is not None
        yield proc, consumers
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for c in consumers:
            await c.stop()


def closed(proc: Any) -> tuple[int, str, str]:
    """Close the process's input; its exit status, stdout and stderr (no traceback in it)."""
    proc.stdin.close()
    rc = proc.wait(timeout=30)
    out, err = proc.stdout.read().decode(), proc.stderr.read().decode()
    assert "Traceback" not in err, err
    return rc, out, err


async def test_publish_on_an_open_pipe_sends_each_completion_while_the_pipe_stays_open(kafka_settings: Settings):
    async with piped(kafka_settings, "task-completions") as (proc, [consumer]):
        for n in (1, 2):
            proc.stdin.write(json.dumps(completion(n)).encode() + b"\n")
            proc.stdin.flush()  # and the pipe stays open
            got = await take(consumer, 1, WITHIN_S)
            assert proc.poll() is None, "publish ended while its input was open"
            assert [(m.key, decode("task-completions", m.value, strict=True)) for m in got] == [
                (b"worker-1", completion(n))], (
                f"completion {n} not on the topic within {WITHIN_S}s of its line, the pipe open")
        rc, out, err = closed(proc)
        assert rc == 0
        assert out.strip() == (f"publish: published to {kafka_settings.topic('task-completions')}: 2 message(s), "
                               "0 invalid record(s); nodes not checked (no --targets, no REDIS_URL)"), (out, err)
        assert await take(consumer, 1, 1.0) == []  # nothing twice


def otlp_export() -> Any:
    from pathlib import Path

    return json.loads((Path(__file__).parents[1] / "fixtures" / "spans" / "otlp-export.json").read_text())


async def test_a_cut_first_line_on_an_open_pipe_is_a_dead_letter_and_the_lines_after_it_are_sent(
        kafka_settings: Settings):
    """A first line cut short -- what a restart of ``tail -F spans.json | rttsched publish`` can hand over -- is
    one invalid line: the lines after it are on the topic while the pipe stays open. It used to be taken as the
    start of a pretty-printed document, and the pipe read to its end: nothing was published."""
    export = otlp_export()
    async with piped(kafka_settings, "task-completions", "--from", "otlp", "--dead-letters",
                     topics=("task-completions", "dead-letters")) as (proc, [completions, letters]):
        proc.stdin.write(b'{"resourceSpans":[{"resource":{"attri\n' + json.dumps(export).encode() + b"\n")
        proc.stdin.flush()  # and the pipe stays open
        got = await take(completions, 2, WITHIN_S)
        assert proc.poll() is None, "publish ended while its input was open"
        assert len(got) == 2, f"the export after the cut line not on the topic within {WITHIN_S}s, the pipe open"
        dead = await take(letters, 1, WITHIN_S)
        assert [(v["offset"], v["reason"]) for v in (json.loads(m.value) for m in dead)] == [(1, "invalid_json")]
        rc, out, err = closed(proc)
        assert rc == 1  # the one invalid line
        assert "<stdin>:1: invalid_json:" in err, err
        assert "2 message(s), 1 span(s) that are no task skipped, 1 invalid record(s)" in out, out


async def test_a_pretty_printed_export_on_an_open_pipe_is_published_once_its_last_line_is_read(
        kafka_settings: Settings):
    """``curl … | rttsched publish task-completions --from otlp -`` with a pretty-printed export: one record,
    published while the pipe stays open. It used to be one invalid line per line, and nothing published."""
    export = otlp_export()
    async with piped(kafka_settings, "task-completions", "--from", "otlp") as (proc, [consumer]):
        pretty = json.dumps(export, indent=2).encode() + b"\n"
        assert pretty.count(b"\n") > 20
        proc.stdin.write(pretty)
        proc.stdin.flush()  # and the pipe stays open
        got = await take(consumer, 2, WITHIN_S)
        assert proc.poll() is None, "publish ended while its input was open"
        assert sorted(decode("task-completions", m.value, strict=True)["task_id"] for m in got) == sorted(
            c["task_id"] for c in completions_of(export)), "the export not on the topic, the pipe open"
        rc, out, err = closed(proc)
        assert rc == 0
        assert "2 message(s), 1 span(s) that are no task skipped, 0 invalid record(s)" in out, (out, err)
        assert "invalid_json" not in err, err


async def test_documents_after_one_cut_short_on_an_open_pipe_are_published_while_it_stays_open(
        kafka_settings: Settings):
    """A pretty-printed document cut short (its writer restarted under ``tail -F``), then three whole ones: the
    three are on the topic before the writer closes the pipe. They used to be gathered with the cut one, whose
    brace never closes -- nothing published while the pipe stayed open."""
    async with piped(kafka_settings, "task-completions") as (proc, [consumer]):
        proc.stdin.write(b'{\n  "task_id": "cut",\n'
                         + b"".join(json.dumps(completion(n), indent=2).encode() + b"\n" for n in (1, 2, 3)))
        proc.stdin.flush()  # and the pipe stays open
        got = await take(consumer, 3, WITHIN_S)
        assert proc.poll() is None, "publish ended while its input was open"
        assert [decode("task-completions", m.value, strict=True) for m in got] == [
            completion(n) for n in (1, 2, 3)], "the documents after the cut one not on the topic, the pipe open"
        rc, out, err = closed(proc)
        assert rc == 1  # the cut document's two lines
        assert "<stdin>:1: invalid_json:" in err and "<stdin>:2: invalid_json:" in err, err
        assert "3 message(s), 2 invalid record(s)" in out, (out, err)


def completions_of(export: Any) -> list[dict[str, Any]]:
    """The completions of an OTLP export, as ``publish`` converts them."""
    from app.bridge.otlp import otlp_to_completions

    return otlp_to_completions(export).completions
