"""A worker whose broker goes away as its own Kafka clients start, once Faust runs, on the real embedded broker.

The worker reads its source topics with clients of its own (:class:`~app.streams.intake.PartitionIntake`: node-features
and feedback-join, each a producer and a consumer; the model-updates reader, a consumer), started by Faust's tasks once
Faust's own clients run. The child holds before each of those starts (it writes ``held-<n>`` and holds until the test
writes ``gone``); the test stops the broker there. Each start then fails on the broker gone and is tried again every
second (the child marks each try), as a broker away while they read is waited out; the worker keeps running. Each
reader says so in one WARNING, not one per try (it logged one a second, three readers: 10,800 lines an hour). With the
broker back, they start (``<name>: its clients started after … waiting for the broker``). While they wait, the worker's
``/readyz`` (200) lists each under ``degraded.kafka``, cleared once they started (it said ``"degraded": {}``). Before,
the first failed start crashed the worker: Faust's ``Crashed reason=KafkaConnectionError`` with a traceback per task,
and the worker stopped on its own (exit code 1), or, with a SIGTERM close by, a traceback in the middle of its stop. A
SIGTERM while they wait stops the worker as with the broker gone while they read, leaving no trace of the waits.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_children import HOLD_UNTIL_GONE, child_env, popen, stops_cleanly, topics_on, wait_for
from child_processes import Gathered

from app.kafka.embedded import EmbeddedBroker

pytestmark = pytest.mark.integration

HELD = 3  # the intakes' producers (node-features, feedback-join) and the model-updates consumer
INTAKES = ("node-features", "feedback-join")
READERS = (*INTAKES, "model-updates")
STOP_S = 3.0  # the worker's stop deadline where the broker is gone at SIGTERM
TRIES = 4  # starts tried with the broker gone before it comes back: three retries, some 3 s

# ``rttsched worker`` whose intakes' producers and model-updates consumer, at their first start, write ``held-<n>``
# and hold (the event loop runs on) until ``gone`` exists
CHILD = """
import asyncio, itertools, os, sys
from pathlib import Path

import app.streams.feedback_models as models
import app.streams.intake as intake

marks, count = Path(os.environ["MARKS"]), itertools.count(1)

""" + HOLD_UNTIL_GONE + """
async def hold():
    await hold_until_gone(f"held-{next(count)}")

class HeldProducer(intake.AIOKafkaProducer):
    async def start(self):
        await hold()
        await super().start()

def tried(name):
    if (marks / "gone").exists():
        with open(marks / f"tries-{name}", "a") as f:
            f.write("x")

class HeldConsumer(models.AIOKafkaConsumer):
    async def start(self):
        await hold()
        tried("model-updates")
        await super().start()

start = intake.PartitionIntake.start

async def counted(self):
    tried(self.name)
    await start(self)

intake.AIOKafkaProducer = HeldProducer
models.AIOKafkaConsumer = HeldConsumer
intake.PartitionIntake.start = counted

from app.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def env(broker: EmbeddedBroker, tmp_path: Path) -> dict[str, str]:
    return child_env(topics_on(broker), tmp_path, RTT_WORKER_DATADIR=str(tmp_path / "faust"), PYTHONUNBUFFERED="1")


@pytest.fixture
def worker(env: dict[str, str], request: pytest.FixtureRequest) -> Iterator[Gathered]:
    stop_timeout_s = getattr(request, "param", "20")  # --stop-timeout-s
    proc = Gathered(popen(CHILD, ("worker", "--stop-timeout-s", stop_timeout_s), env))
    yield proc
    proc.kill()


def tries(tmp_path: Path, name: str) -> int:
    """The starts of ``name``'s clients tried since the broker was stopped (the child marks each)."""
    marks = tmp_path / f"tries-{name}"
    return len(marks.read_text()) if marks.exists() else 0


def readyz(env: dict[str, str]) -> tuple[int, dict[str, object]]:
    """The worker's ``/readyz``: its status and JSON body (a 503's text fails the test)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{env['RTT_METRICS_PORT']}/readyz", timeout=5) as r:
        return r.status, json.loads(r.read())


def kafka_waits(env: dict[str, str]) -> str:
    """``degraded.kafka`` of the worker's ``/readyz`` ("" when it has none)."""
    status, body = readyz(env)
    assert status == 200 and body["ready"] is True, body
    return str(body["degraded"].get("kafka", ""))  # type: ignore[attr-defined]


def metrics(env: dict[str, str]) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{env['RTT_METRICS_PORT']}/metrics", timeout=5) as r:
        return str(r.read().decode())


def warnings(text: str, name: str) -> list[str]:
    """The WARNING lines of ``name``'s clients' start waiting for the broker."""
    return [line for line in text.splitlines()
            if re.search(rf" WARNING \S+: {name}: (KafkaConnectionError\(.*\) as its|its \S+ still not)", line)]


def test_a_broker_gone_as_the_workers_own_clients_start_is_waited_out_and_they_start_once_it_is_back(
        worker: Gathered, broker: EmbeddedBroker, tmp_path: Path, env: dict[str, str]) -> None:
    wait_for(worker, lambda: all((tmp_path / f"held-{n}").exists() for n in range(1, HELD + 1)),
             "the holds before the intakes' and the model-updates reader's starts")
    broker.stop()
    with pytest.raises(OSError):
        __import__("socket").create_connection((broker.host, broker.port), timeout=2).close()
    (tmp_path / "gone").write_text("")
    # each start failed, and was tried again every second: the worker runs on (it crashed at the first), and says
    # so once per reader, not once per try (again only after START_REMIND_S)
    for name in READERS:
        wait_for(worker, lambda name=name: tries(tmp_path, name) >= TRIES, f"{name}'s start tried {TRIES} times")  # type: ignore[misc]
    assert worker.proc.poll() is None, worker.text[-8000:]
    for name in READERS:
        said = warnings(worker.text, name)
        assert len(said) == 1 and " as its " in said[0] and "retrying every 1 s" in said[0], said
    # /readyz names each reader that waits, since when, and its last error (it said "degraded": {})
    waits = kafka_waits(env)
    for name, clients in (("node-features", "clients"), ("feedback-join", "clients"), ("model-updates", "consumer")):
        assert re.search(rf"\b{name}: its {clients} not started for [1-9]\d* s \(\d+ tries\): \w+Error\(", waits), waits
    assert re.search(r"rtt_worker_degraded\{reason=\"kafka\"\} 1\.0", metrics(env)), waits

    broker.start()  # the same port
    for name in INTAKES:
        wait_for(worker, lambda name=name: f" INFO app.streams.intake: {name}: its consumer and producer started"  # type: ignore[misc]
                 in worker.text, f"{name}'s clients started once the broker was back")
    for name in READERS:
        wait_for(worker, lambda name=name: re.search(rf" INFO \S+: {name}: its \S+ started after \d+ s waiting for "  # type: ignore[misc]
                                                     r"the broker \(\d+ tries failed\)", worker.text) is not None,
                 f"{name}'s line on its start after the wait")
        assert len(warnings(worker.text, name)) == 1, warnings(worker.text, name)
    assert kafka_waits(env) == ""  # all three started: the reason is cleared
    assert re.search(r"rtt_worker_degraded\{reason=\"kafka\"\} 0\.0", metrics(env))
    stops_cleanly(worker)



@pytest.mark.parametrize("worker", [f"{STOP_S:g}"], indirect=True)
def test_sigterm_while_the_workers_own_clients_wait_for_the_broker_stops_by_the_deadline_without_a_trace(
        worker: Gathered, broker: EmbeddedBroker, tmp_path: Path) -> None:
    """SIGTERM with the broker gone, its readers waiting for it: the stop ends as with the broker gone while they read
    (Faust's consumer thread waits for it: one ERROR line at the deadline, exit code 1), and their waits leave no
    trace: no traceback, no task destroyed pending, no client left unclosed."""
    wait_for(worker, lambda: all((tmp_path / f"held-{n}").exists() for n in range(1, HELD + 1)),
             "the holds before the intakes' and the model-updates reader's starts")
    broker.stop()
    (tmp_path / "gone").write_text("")
    for name in READERS:
        wait_for(worker, lambda name=name: tries(tmp_path, name) >= 2, f"{name}'s start tried again")  # type: ignore[misc]
    t0 = time.monotonic()
    os.killpg(worker.proc.pid, signal.SIGTERM)
    code = worker.proc.wait(STOP_S + 30)
    took = time.monotonic() - t0
    worker.read_to_end()
    text = worker.text
    assert "Traceback" not in text and "Task was destroyed" not in text and "Unclosed" not in text, text[-8000:]
    assert code == 1 and took < STOP_S + 9, f"exit {code} after {took:.1f} s:\n{text[-8000:]}"
    errors = [line for line in text.splitlines() if " ERROR app." in line]
    assert len(errors) == 1 and f"did not finish stopping within {STOP_S:g} s of SIGTERM" in errors[0], errors
