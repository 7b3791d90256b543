"""A worker whose broker answers its start wait (:func:`app.kafka.admin.wait_reachable`) and is gone when Faust's own
clients start, on the real embedded broker. The child stops between the two: the wait answered, it says so in a file
and holds until the test has stopped the broker; the test starts the broker again only when the worker has said what
happened.

Gone before Faust's producer connected (nothing taken over yet: the port is still the worker's, no consumer ran),
the worker goes back to waiting: one WARNING naming the broker and ``RTT_KAFKA_BOOTSTRAP``, ``/readyz`` 503 on its
port meanwhile, and a new Faust app once the broker and its topics are back (``/readyz`` 200); SIGTERM then stops it
with code 0. Gone once the producer had connected (its web server had the port), it ends with one line, ``rttsched
worker: error: cannot reach Kafka at … (RTT_KAFKA_BOOTSTRAP) …``, and exit code 2. Before, both ended with Faust's
``Error: KafkaConnectionError`` and its traceback, exit code 1. Another Kafka error that ends the start ends the worker
at once the same way (waiting again would not help); with ``-v`` the failure's traceback is logged; a Kafka error once
the clients have started (the tables' recovery) is Faust's crash, its reason logged."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from broker_children import START_S, child_env, popen, topics_on, wait_for
from child_processes import Gathered, http_get

from app.config import Settings
from app.kafka.admin import ensure_topics
from app.kafka.embedded import EmbeddedBroker

pytestmark = pytest.mark.integration

# ``rttsched worker`` whose first start wait, once it has passed, writes ``answered`` and holds until ``gone`` exists
# (the test stopped the broker then); with HOLD=producer it holds once Faust's producer has started instead (HOLD=late:
# that too, and the start of the consumer's thread looks at it only once the thread has crashed). With
# HOLD=version, Faust's producer fails to start with a Kafka error that is not the broker gone; with HOLD=recovery,
# the tables' recovery fails with a Kafka error once the clients have started (the broker stays up)
CHILD = """
import asyncio, os, sys, time
from pathlib import Path

import faust.tables.recovery as recovery
import faust.transport.drivers.aiokafka as driver
from aiokafka.errors import KafkaTimeoutError, UnsupportedVersionError

import app.kafka.admin as admin

marks = Path(os.environ["MARKS"])

async def hold():
    (marks / "answered").write_text("")
    while not (marks / "gone").exists():
        await asyncio.sleep(0.05)

if os.environ["HOLD"] == "version":
    async def refused(self):
        raise UnsupportedVersionError("the broker does not support the producer's requests")

    driver.Producer.on_start = refused
elif os.environ["HOLD"] == "recovery":
    async def no_answer(self, *args, **kwargs):
        raise KafkaTimeoutError("no answer to the offset request of the recovery")

    recovery.Recovery._build_highwaters = no_answer
elif os.environ["HOLD"] == "wait":
    real, waits = admin.wait_reachable, []

    async def wait_reachable(*args, **kwargs):
        waited = await real(*args, **kwargs)
        waits.append(waited)
        if len(waits) == 1:
            await hold()
        return waited

    admin.wait_reachable = wait_reachable
else:
    if os.environ["HOLD"] == "late":  # the consumer's thread crashed before its start looked (a loaded machine's order)
        from mode.threads import WorkerThread

        begin = WorkerThread.start

        def start(self):
            begin(self)
            until = time.monotonic() + 30
            while isinstance(self.service, driver.AIOKafkaConsumerThread) and not self.service._crashed.is_set() \
                    and time.monotonic() < until:
                time.sleep(0.01)

        WorkerThread.start = start
    started = driver.Producer.on_start

    async def on_start(self):
        await started(self)
        await hold()

    driver.Producer.on_start = on_start

from app.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


class Worker(Gathered):
    """The child ``rttsched worker``, its output (stdout and stderr together) gathered by a thread."""

    def __init__(self, env: dict[str, str], args: tuple[str, ...] = ()) -> None:
        super().__init__(popen(CHILD, (*args, "worker"), env))

    def wait_for(self, what: Callable[[], bool], label: str, timeout_s: float = START_S) -> None:
        wait_for(self, what, label, timeout_s)

    def line(self, pattern: str, timeout_s: float = START_S) -> None:
        self.wait_for(lambda: re.search(pattern, self.text) is not None, repr(pattern), timeout_s)

    def ended(self, timeout_s: float) -> int:
        code = self.proc.wait(timeout_s)
        self.read_to_end()
        return code


@pytest.fixture
def start_worker(tmp_path: Path, broker: EmbeddedBroker) -> Iterator[Callable[..., tuple[Worker, Settings, int]]]:
    started: list[Worker] = []

    def start(hold: str, *args: str) -> tuple[Worker, Settings, int]:
        settings = topics_on(broker)
        env = child_env(settings, tmp_path, RTT_WORKER_DATADIR=str(tmp_path / "faust"), HOLD=hold)
        worker = Worker(env, args)
        started.append(worker)
        return worker, settings, int(env["RTT_METRICS_PORT"])

    yield start
    for worker in started:
        worker.kill()


def stop_broker_when_answered(worker: Worker, broker: EmbeddedBroker, marks: Path) -> None:
    """Once the worker holds (``answered``), stop the broker, see its port refuse connections, let the worker on."""
    worker.wait_for((marks / "answered").exists, "the hold after the wait")
    broker.stop()
    with pytest.raises(OSError):
        __import__("socket").create_connection((broker.host, broker.port), timeout=2).close()
    (marks / "gone").write_text("")


def errors(text: str) -> list[str]:
    """The lines of ``text`` that say ``rttsched worker: error: ``."""
    return [line for line in text.splitlines() if line.startswith("rttsched worker: error: ")]


def refused(bootstrap: str) -> str:
    """The one line of a worker whose producer the broker at ``bootstrap`` refused (the child's ``version`` hold)."""
    return (f"rttsched worker: error: the worker's clients failed to start on Kafka at {bootstrap}"
            " (RTT_KAFKA_BOOTSTRAP): [Error 35] UnsupportedVersionError: the broker does not support the"
            " producer's requests")


def assert_no_traceback(text: str) -> None:
    print("".join(line + "\n" for line in text.splitlines() if " INFO " not in line))  # what a user reads
    assert "Traceback" not in text and "Unclosed" not in text and "run with -v" not in text, text[-6000:]
    assert not [line for line in text.splitlines() if " ERROR " in line or " CRITICAL " in line], text[-6000:]


def test_a_broker_gone_before_fausts_producer_connected_sends_the_worker_back_to_waiting(
        start_worker: Callable[..., tuple[Worker, Settings, int]], broker: EmbeddedBroker, tmp_path: Path) -> None:
    worker, settings, metrics = start_worker("wait")
    stop_broker_when_answered(worker, broker, tmp_path)
    bootstrap = re.escape(broker.bootstrap)
    worker.line(rf"WARNING app\.cli\.worker: worker: cannot reach Kafka at {bootstrap} \(RTT_KAFKA_BOOTSTRAP\) as"
                r" Faust started: .*; waiting for it again")
    worker.line(rf"WARNING app\.kafka\.admin: worker: waiting for Kafka: cannot reach Kafka at {bootstrap}")
    time.sleep(2.0)  # a try more: still waiting, its port answering probes
    assert worker.proc.poll() is None, worker.text[-6000:]
    status, body = http_get(metrics, "/readyz")
    assert status == 503 and body.startswith(b"not ready: kafka: cannot reach Kafka at"), (status, body)

    broker.start()  # the same port, an empty broker: its topics again
    asyncio.run(ensure_topics(settings))
    back_at = time.monotonic()
    worker.wait_for(lambda: http_get(metrics, "/readyz") == (200, b'{"ready":true,"degraded":{}}'),
                    "Faust's /readyz 200 after the broker came back")
    print(f"worker ready {time.monotonic() - back_at:.1f} s after the broker and its topics were back")
    assert worker.text.count(f"worker {settings.topic_prefix}rttsched-worker on {broker.bootstrap}") == 2
    os.killpg(worker.proc.pid, signal.SIGTERM)
    assert worker.ended(60) == 0, worker.text[-6000:]
    assert_no_traceback(worker.text)


# late: the consumer's thread fails its bootstrap and crashes before the start that began it looks at it: the start
# then ends without an error, the worker crashed (it ended with Faust's crash, exit code 1, on a loaded machine)
@pytest.mark.parametrize("hold", ["producer", "late"])
def test_a_broker_gone_once_fausts_producer_connected_ends_the_worker_with_one_line_and_code_2(
        start_worker: Callable[..., tuple[Worker, Settings, int]], broker: EmbeddedBroker, tmp_path: Path,
        hold: str) -> None:
    worker, _, _ = start_worker(hold)
    stop_broker_when_answered(worker, broker, tmp_path)
    code = worker.ended(START_S)
    text = worker.text
    assert code == 2, text[-6000:]
    said = errors(text)
    assert len(said) == 1 and said[0].startswith(
        f"rttsched worker: error: cannot reach Kafka at {broker.bootstrap} (RTT_KAFKA_BOOTSTRAP) as the worker"
        " started: "), text[-6000:]
    assert_no_traceback(text)


def test_with_v_the_start_failure_has_its_traceback_and_sigterm_in_the_second_wait_exits_0(
        start_worker: Callable[..., tuple[Worker, Settings, int]], broker: EmbeddedBroker, tmp_path: Path) -> None:
    worker, _, _ = start_worker("wait", "-v")
    stop_broker_when_answered(worker, broker, tmp_path)
    worker.line(r"WARNING app\.kafka\.admin: worker: waiting for Kafka: cannot reach Kafka at ")
    text = worker.text
    failed = text.index("DEBUG app.streams.shutdown: the worker's start failed\nTraceback (most recent call last):")
    assert "KafkaConnectionError" in text[failed:].split("\n20", 1)[0], text[failed:failed + 6000]
    asked = time.monotonic()
    os.killpg(worker.proc.pid, signal.SIGTERM)
    assert worker.ended(30) == 0, worker.text[-6000:]
    print(f"stopped {time.monotonic() - asked:.1f} s after SIGTERM")
    assert "worker: stopped (SIGTERM) while waiting for Kafka" in worker.text


def test_a_kafka_error_that_is_not_the_broker_gone_ends_the_worker_at_once_with_one_line_and_code_2(
        start_worker: Callable[..., tuple[Worker, Settings, int]], broker: EmbeddedBroker) -> None:
    worker, _, _ = start_worker("version")
    code = worker.ended(START_S)  # it used to wait again and again: the broker answered each wait at once
    text = worker.text
    assert code == 2, text[-6000:]
    assert errors(text) == [refused(broker.bootstrap)], text[-6000:]
    assert "waiting for it again" not in text and text.count("-rttsched-worker on ") == 1, text[-6000:]
    assert_no_traceback(text)


def test_a_kafka_error_once_the_clients_started_is_faust_s_crash_with_its_reason(
        start_worker: Callable[..., tuple[Worker, Settings, int]]) -> None:
    worker, _, _ = start_worker("recovery")
    code = worker.ended(START_S)
    text = worker.text
    assert code == 1, text[-6000:]
    assert re.search(r" ERROR \S+: \[\S+\]: Crashed reason=KafkaTimeoutError\('no answer to the offset request of the"
                     r" recovery'\)\n", text), text[-6000:]
    assert "rttsched worker: error: " not in text, text[-6000:]
