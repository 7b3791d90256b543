"""A worker whose broker goes away as its own Kafka clients start, once Faust runs, on the real embedded broker.

The worker reads its source topics with clients of its own (:class:`~app.streams.intake.PartitionIntake`: node-features
and feedback-join, each a producer and a consumer; the model-updates reader, a consumer), started by Faust's tasks once
Faust's own clients run. The child holds before each of those starts (it writes ``held-<n>`` and holds until the test
writes ``gone``); the test stops the broker there. Each start then fails on the broker gone: one WARNING each, and the
start is tried again every second, as a broker away while they read is waited out; the worker keeps running. With the
broker back, they start (``<name>: its consumer and producer started``). Before, the first failed start crashed the
worker: Faust's ``Crashed reason=KafkaConnectionError`` with a traceback per task, and the worker stopped on its own
(exit code 1), or, with a SIGTERM close by, a traceback in the middle of its stop.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from child_processes import Gathered

from app.config import Settings
from app.kafka.admin import ensure_topics
from app.kafka.embedded import EmbeddedBroker, free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
START_S = 90.0  # imports, the wait and Faust's start on a loaded machine
HELD = 3  # the intakes' producers (node-features, feedback-join) and the model-updates consumer
INTAKES = ("node-features", "feedback-join")

# ``rttsched worker`` whose intakes' producers and model-updates consumer, at their first start, write ``held-<n>``
# and hold (the event loop runs on) until ``gone`` exists
CHILD = """
import asyncio, itertools, os, sys
from pathlib import Path

import app.streams.feedback_models as models
import app.streams.intake as intake

marks, count = Path(os.environ["MARKS"]), itertools.count(1)

async def hold():
    if not (marks / "gone").exists():
        (marks / f"held-{next(count)}").write_text("")
    while not (marks / "gone").exists():
        await asyncio.sleep(0.02)

class HeldProducer(intake.AIOKafkaProducer):
    async def start(self):
        await hold()
        await super().start()

class HeldConsumer(models.AIOKafkaConsumer):
    async def start(self):
        await hold()
        await super().start()

intake.AIOKafkaProducer = HeldProducer
models.AIOKafkaConsumer = HeldConsumer

from app.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:  # stopped whatever the test did
        yield b


@pytest.fixture
def worker(broker: EmbeddedBroker, tmp_path: Path) -> Iterator[Gathered]:
    settings = Settings.from_env({}, kafka_bootstrap=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}-")
    asyncio.run(ensure_topics(settings))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTT_") and k != "REDIS_URL"}
    env.update(RTT_KAFKA_BOOTSTRAP=broker.bootstrap, RTT_TOPIC_PREFIX=settings.topic_prefix,
               RTT_METRICS_PORT=str(free_port()), RTT_METRICS_HOST="127.0.0.1",
               RTT_WORKER_DATADIR=str(tmp_path / "faust"), RTT_MODELS_DIR=str(tmp_path / "models"),
               MARKS=str(tmp_path), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    proc = Gathered(subprocess.Popen([sys.executable, "-c", CHILD, "worker", "--stop-timeout-s", "20"], env=env,
                                     cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True))
    yield proc
    proc.kill()


def wait_for(proc: Gathered, what: Callable[[], bool], label: str) -> None:
    deadline = time.monotonic() + START_S
    while not what():
        if proc.proc.poll() is not None:
            proc.read_to_end()
            if what():
                return
            pytest.fail(f"ended (exit {proc.proc.returncode}) before {label}:\n{proc.text[-8000:]}")
        assert time.monotonic() < deadline, f"no {label} within {START_S:g} s:\n{proc.text[-8000:]}"
        time.sleep(0.05)


def retries(text: str, name: str) -> int:
    return len(re.findall(rf" WARNING \S+: {name}: KafkaConnectionError\(.*\) as its (clients|consumer) started;"
                          r" retrying", text))


def test_a_broker_gone_as_the_workers_own_clients_start_is_waited_out_and_they_start_once_it_is_back(
        worker: Gathered, broker: EmbeddedBroker, tmp_path: Path) -> None:
    wait_for(worker, lambda: all((tmp_path / f"held-{n}").exists() for n in range(1, HELD + 1)),
             "the holds before the intakes' and the model-updates reader's starts")
    broker.stop()
    with pytest.raises(OSError):
        __import__("socket").create_connection((broker.host, broker.port), timeout=2).close()
    (tmp_path / "gone").write_text("")
    # each start failed, and was tried again and failed again: the worker runs on (it crashed at the first)
    for name in (*INTAKES, "model-updates"):
        wait_for(worker, lambda name=name: retries(worker.text, name) >= 2, f"{name}'s start tried again")  # type: ignore[misc]
    assert worker.proc.poll() is None, worker.text[-8000:]

    broker.start()  # the same port
    for name in INTAKES:
        wait_for(worker, lambda name=name: f" INFO app.streams.intake: {name}: its consumer and producer started"  # type: ignore[misc]
                 in worker.text, f"{name}'s clients started once the broker was back")
    os.killpg(worker.proc.pid, signal.SIGTERM)
    code = worker.proc.wait(60)
    worker.read_to_end()
    text = worker.text
    print("".join(line + "\n" for line in text.splitlines() if " WARNING " in line or " ERROR " in line))
    assert "Traceback" not in text and "Crashed reason=" not in text and "Unclosed" not in text, text[-8000:]
    assert code == 0, text[-8000:]
