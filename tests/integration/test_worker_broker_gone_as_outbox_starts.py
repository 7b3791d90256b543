"""A worker whose broker goes away as its errors outbox's consumer starts, on the real embedded broker.

The outbox (:class:`~app.streams.feedback_outbox.ErrorsOutbox`) starts a consumer of its own when an error period
closes (where prediction-errors and retrain-events end, before anything is staged) and when it looks for messages
in those topics. The test feeds one prediction / completion pair; at the period's close the child holds before
that consumer's start (it writes ``held`` and holds until the test writes ``gone``), and the test stops the broker
there. The start fails; the period's tick fails with one WARNING, and the next tick tries again while the worker
runs on. The consumer whose start failed is closed: before, it was left unclosed and each failed try logged
asyncio's ``ERROR Unclosed AIOKafkaConsumer`` as it was dropped. With the broker back, the period closes and its
prediction-errors message goes out; a SIGTERM then stops the worker with exit code 0.
"""

from __future__ import annotations

import asyncio
import gc
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from broker_children import HOLD_UNTIL_GONE, START_S, child_env, popen, stops_cleanly, topics_on, wait_for
from child_processes import Gathered

from app.config import Settings
from app.contracts import contract
from app.kafka.admin import ensure_topics
from app.kafka.client import client_options
from app.kafka.embedded import EmbeddedBroker
from app.retry import Backoff
from app.sim.scripted import prediction, produce
from app.streams.feedback_outbox import ErrorsOutbox, outbox_row_key

pytestmark = pytest.mark.integration

APP, NODE = "gCTF", "gpu-o1"

# ``rttsched worker`` whose outbox consumer, at its first start, writes ``held`` and holds (the event loop runs on)
# until ``gone`` exists; each start that passes writes ``started-<n>``
CHILD = """
import asyncio, itertools, os, sys
from pathlib import Path

import app.streams.feedback_outbox as outbox

marks, count = Path(os.environ["MARKS"]), itertools.count(1)

""" + HOLD_UNTIL_GONE + """
class HeldConsumer(outbox.AIOKafkaConsumer):
    async def start(self):
        await hold_until_gone()
        await super().start()
        (marks / f"started-{next(count)}").write_text("")

outbox.AIOKafkaConsumer = HeldConsumer

from app.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def settings(broker: EmbeddedBroker) -> Settings:
    return topics_on(broker)


@pytest.fixture
def worker(settings: Settings, broker: EmbeddedBroker, tmp_path: Path) -> Iterator[Gathered]:
    env = child_env(settings, tmp_path, RTT_ERROR_PERIOD_S="1", RTT_WORKER_DATADIR=str(tmp_path / "faust"),
                    PYTHONUNBUFFERED="1")
    proc = Gathered(popen(CHILD, ("worker", "--stop-timeout-s", "20"), env))
    yield proc
    proc.kill()


def failed_ticks(text: str) -> int:
    return len(re.findall(r" WARNING \S+: timer feedback-errors: this tick failed \(KafkaConnectionError\(", text))


def one_pair(t0: float) -> list[tuple[str, dict[str, Any]]]:
    return [("rtt-predictions", prediction("o-1", APP, NODE, t0, 220.0)),
            ("task-completions", {"task_id": "o-1", "app": APP, "node": NODE, "submitted_ts": t0 - 0.01,
                                  "started_ts": t0, "finished_ts": t0 + 0.2, "rtt_ms": 200.0, "status": "ok"})]


async def errors_of(s: Settings, node: str, timeout_s: float) -> list[dict[str, Any]]:
    """The prediction-errors messages of ``node`` read from the start within ``timeout_s`` (once one is there)."""
    c = AIOKafkaConsumer(**client_options(s, auto_offset_reset="earliest", enable_auto_commit=False, group_id=None))
    await c.start()
    found: list[dict[str, Any]] = []
    try:
        topic = s.topic("prediction-errors")
        c.assign([TopicPartition(topic, p) for p in range(contract("prediction-errors").partitions)])
        deadline = time.monotonic() + timeout_s
        while not found and time.monotonic() < deadline:
            for records in (await c.getmany(timeout_ms=200)).values():
                found += [v for v in (orjson.loads(r.value) for r in records if r.value) if v.get("node") == node]
    finally:
        await c.stop()
    return found


def test_a_broker_gone_as_the_outbox_consumer_starts_is_waited_out_and_the_consumer_closed(
        worker: Gathered, broker: EmbeddedBroker, settings: Settings, tmp_path: Path) -> None:
    wait_for(worker, lambda: " INFO app.streams.intake: feedback-join: its consumer and producer started"
             in worker.text, "the feedback-join intake's start")
    asyncio.run(produce(settings, one_pair(time.time())))
    wait_for(worker, lambda: (tmp_path / "held").exists(), "the hold before the outbox consumer's start")
    broker.stop()
    with pytest.raises(OSError):
        __import__("socket").create_connection((broker.host, broker.port), timeout=2).close()
    (tmp_path / "gone").write_text("")
    # the start failed, the next tick tried again and failed again: the worker runs on, the consumers closed
    wait_for(worker, lambda: failed_ticks(worker.text) >= 2, "the period's close tried again")
    assert worker.proc.poll() is None, worker.text[-8000:]
    time.sleep(0.5)  # a dropped consumer left unclosed says so as it is dropped
    assert "Unclosed" not in worker.text, worker.text[-8000:]
    assert not (tmp_path / "started-1").exists()

    broker.start()  # the same port; in memory, so its topics are created again
    asyncio.run(ensure_topics(settings))
    wait_for(worker, lambda: (tmp_path / "started-1").exists(), "the outbox consumer's start once the broker was back")
    values = asyncio.run(errors_of(settings, NODE, START_S))
    assert [v["apps"][APP]["n"] for v in values] == [1], values
    stops_cleanly(worker)


def test_the_outbox_closes_its_consumers_whose_start_fails_on_a_broker_gone(
        settings: Settings, broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture) -> None:
    """Both of the outbox's consumers (where the topics end; looking for restored messages) meet the broker gone as
    they start: each try fails, and the consumer it made is closed (before, each was left unclosed: asyncio's
    ``Unclosed AIOKafkaConsumer`` as it was dropped)."""
    broker.stop()

    async def run() -> tuple[list[str], int]:
        outbox = ErrorsOutbox(settings)
        for _ in range(2):
            with pytest.raises(Exception) as caught:
                await outbox.prepare({0})
            assert "KafkaConnectionError" in type(caught.value).__name__
        key = outbox_row_key(0, NODE, 1000.0)
        outbox.restore(0, key, orjson.dumps({"value": {"node": NODE, "ts": 1000.0, "apps": {}}, "floor": 0}))
        failures: list[str] = []
        task = asyncio.get_running_loop().create_task(outbox.reconcile_until_done(
            lambda: {0}, Backoff(first_s=0.05, max_s=0.1, jitter=0.0),
            on_failure=lambda _n, exc: failures.append(type(exc).__name__), timeout_s=2.0))
        while len(failures) < 3:
            await asyncio.sleep(0.02)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return failures, outbox.unchecked()

    with caplog.at_level("ERROR", logger="asyncio"):
        failures, unchecked = asyncio.run(run())
        gc.collect()
    assert set(failures) == {"KafkaConnectionError"} and unchecked == 1
    assert not [r for r in caplog.records if "Unclosed" in r.getMessage()], caplog.text
