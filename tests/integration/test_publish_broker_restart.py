"""``rttsched publish`` as a long-lived pipe while its broker goes away, against the real embedded broker: what
the broker did not take is held and sent again once it is back (at least once), nothing read is lost, and the
process neither ends nor prints a traceback. Before, an outage longer than the producer's request timeout (10 s)
ended ``publish`` with an aiokafka error (rc 1) and lost every line read and not yet sent."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from app.config import Settings
from app.kafka.admin import ensure_topics
from app.kafka.embedded import EmbeddedBroker

pytestmark = pytest.mark.integration

AWAY_S = 13.0  # the broker is away longer than the producer's request timeout (10 s)


def completion(n: int) -> dict[str, Any]:
    return {"task_id": f"away-{n}", "app": "upload", "node": f"worker-{n % 3}", "submitted_ts": 10.0 + n,
            "started_ts": 11.0 + n, "finished_ts": 13.5 + n, "rtt_ms": 3500.0, "status": "ok"}


async def topic_values(settings: Settings, topic: str, until: Any = None, timeout_s: float = 15.0) -> list[Any]:
    """Every value on the contract ``topic`` from its start: once ``until(values)`` holds, or after
    ``timeout_s`` (without ``until``: what came within a few quiet seconds)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers, enable_auto_commit=False)
    await consumer.start()
    try:
        name = settings.topic(topic)
        await consumer.topics()  # metadata of every topic
        tps = [TopicPartition(name, p) for p in sorted(consumer.partitions_for_topic(name) or ())]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        values: list[Any] = []
        deadline = time.monotonic() + timeout_s
        quiet_until = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            got = [json.loads(m.value) for msgs in batch.values() for m in msgs]
            values.extend(got)
            if until is not None and until(values):
                break
            if until is None:
                if got:
                    quiet_until = time.monotonic() + 3.0
                elif time.monotonic() >= quiet_until:
                    break
        return values
    finally:
        await consumer.stop()


def start_publish(settings: Settings, *extra: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # nodes not checked
    env.update(RTT_KAFKA_BOOTSTRAP=settings.kafka_bootstrap, RTT_TOPIC_PREFIX=settings.topic_prefix)
    return subprocess.Popen([sys.executable, "-m", "app.cli.main", "publish", "task-completions", "-", *extra],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def write(proc: subprocess.Popen[bytes], line: bytes) -> None:
    assert proc.poll() is None, f"publish ended (rc {proc.returncode}) while its input was open: " + (
        proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else "")
    assert proc.stdin is not None
    proc.stdin.write(line + b"\n")
    proc.stdin.flush()


def task_ids(values: list[Any]) -> set[str]:
    return {v["task_id"] for v in values}


@contextlib.contextmanager
def publishing(name: str, *flags: str) -> Iterator[tuple[EmbeddedBroker, Settings, subprocess.Popen[bytes]]]:
    """A broker of its own with the topics of topics/, and `rttsched publish` reading a pipe into it; both stopped
    after."""
    broker = EmbeddedBroker().start()
    settings = Settings.from_env({}, kafka_bootstrap=broker.bootstrap, topic_prefix=f"{name}{uuid.uuid4().hex[:8]}-")
    proc: subprocess.Popen[bytes] | None = None
    try:
        asyncio.run(ensure_topics(settings))
        proc = start_publish(settings, *flags)
        yield broker, settings, proc
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        broker.stop()


def one_delivered_then_broker_gone(broker: EmbeddedBroker, settings: Settings, proc: subprocess.Popen[bytes]) -> None:
    """Line 1 delivered; the broker killed for good; lines 2 and 3 written, which publish holds: line 2 in the
    try under way, line 3 (written a moment later, while that try lasts) read ahead and not taken yet."""
    write(proc, json.dumps(completion(1)).encode())
    asyncio.run(topic_values(settings, "task-completions", lambda vs: len(vs) >= 1))
    broker.kill()
    write(proc, json.dumps(completion(2)).encode())
    time.sleep(1.0)
    write(proc, json.dumps(completion(3)).encode())


def test_publish_holds_what_a_stopped_broker_did_not_take_and_sends_it_once_it_is_back() -> None:
    with publishing("away", "--dead-letters") as (broker, settings, proc):
        for n in (1, 2, 3):
            write(proc, json.dumps(completion(n)).encode())
        before = asyncio.run(topic_values(settings, "task-completions",
                                          lambda vs: len(task_ids(vs)) >= 3))
        assert task_ids(before) == {"away-1", "away-2", "away-3"}

        broker.kill()  # stopped: in memory, its topics go with it
        for n in (4, 5, 6):
            write(proc, json.dumps(completion(n)).encode())
            time.sleep(0.3)
        write(proc, b'{"task_id": "away-bad"')  # an invalid line while the broker is away: a dead letter
        time.sleep(AWAY_S)
        write(proc, json.dumps(completion(7)).encode())  # read while the broker is still away

        # started again on the same port; publish is paused across the start so that the topics come from
        # topics/ first -- Tansu creates a topic with its own partition count the moment a client asks
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            broker.start()
            asyncio.run(ensure_topics(settings))
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        for n in (8, 9):
            write(proc, json.dumps(completion(n)).encode())
        assert proc.stdin is not None
        proc.stdin.close()
        rc = proc.wait(timeout=60)
        out = proc.stdout.read().decode()  # type: ignore[union-attr]
        err = proc.stderr.read().decode()  # type: ignore[union-attr]
        after = asyncio.run(topic_values(settings, "task-completions",
                                         lambda vs: task_ids(vs) >= {f"away-{n}" for n in range(4, 10)}))
        letters = asyncio.run(topic_values(settings, "dead-letters", lambda vs: len(vs) >= 1))

    assert "Traceback" not in err, err
    assert rc == 1, (rc, out, err)  # the one invalid line
    # every line written before, during and after the outage arrived (at least once)
    assert task_ids(before) | task_ids(after) == {f"away-{n}" for n in range(1, 10)}, (out, err)
    assert [v["offset"] for v in letters] == [7], letters  # the invalid line, its line number as offset
    assert err.count("WARNING app.cli.publish") == 1, err  # one line when it starts waiting...
    assert "did not take" in err and "holding them" in err, err
    assert err.count("INFO app.cli.publish") == 1, err  # ...and one when it delivers again
    assert "takes messages again" in err, err
    assert "9 message(s), 1 invalid record(s) (sent to dead-letters)" in out, out


def test_publish_gives_up_after_the_time_given_and_says_what_was_not_sent() -> None:
    with publishing("gone", "--give-up-after", "2") as (broker, settings, proc):
        one_delivered_then_broker_gone(broker, settings, proc)
        rc = proc.wait(timeout=60)  # the input still open
        out = proc.stdout.read().decode()  # type: ignore[union-attr]
        err = proc.stderr.read().decode()  # type: ignore[union-attr]
    assert "Traceback" not in err, err
    assert rc == 3, (rc, out, err)  # not 1: that is "some input lines were invalid"
    assert "published to" in out and "1 message(s), 0 invalid record(s)" in out, out
    assert "--give-up-after 2" in err and "message(s) not sent, the input from <stdin>:2 on is not published" in err


@pytest.mark.parametrize("when", ["in-its-first-try", "while-it-holds-them"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_publish_stopped_by_a_signal_while_it_holds_messages_says_what_was_not_sent(signum: int, when: str) -> None:
    """SIGTERM (how Kubernetes and systemd stop it) and SIGINT (Ctrl-C) alike, during the first try of line 2
    (the broker just gone) or once that try failed and publish holds line 2: it stops, with the count of the
    messages read and not sent -- line 2, in flight or held, and line 3, read ahead -- and line 2 as the one to
    resume from, exit status 130, no traceback. While it holds them it stops at once; in the first try, once the
    producer has let the batch in flight go (the 10 s request timeout at most). Before, SIGTERM in the first try
    hung (the producer's own tasks were cancelled before its last try), and SIGINT said "1 message(s) not sent
    (from <stdin>:3 on)": line 2 in flight was left out."""
    with publishing("sig") as (broker, settings, proc):
        one_delivered_then_broker_gone(broker, settings, proc)
        assert proc.stderr is not None
        said = b""
        if when == "while-it-holds-them":
            deadline = time.monotonic() + 60.0
            while b"holding them" not in said and time.monotonic() < deadline:  # the WARNING: it holds them now
                said += proc.stderr.readline()
            assert b"holding them" in said, said
        else:
            time.sleep(1.0)  # line 2's first try began 2 s ago; it fails after the 10 s request timeout
        proc.send_signal(signum)
        signalled = time.monotonic()
        rc = proc.wait(timeout=30)
        stopped_s = time.monotonic() - signalled
        err = said.decode() + proc.stderr.read().decode()
    assert "Traceback" not in err, err
    assert rc == 130, (rc, err)
    assert "2 message(s) not sent (from <stdin>:2 on)" in err, err
    assert "rttsched publish: interrupted" in err, err
    if when == "while-it-holds-them":
        assert stopped_s < 5.0, f"{stopped_s:.1f} s after the signal"  # not after another try of up to 10 s
    else:
        assert "holding them" not in err, err  # the signal came in the first try: no other try after it
        assert stopped_s < 12.0, f"{stopped_s:.1f} s after the signal"  # the rest of the request timeout
