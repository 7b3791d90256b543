"""``rttsched worker`` answers ``/readyz`` 200 only once its Kafka consumer has started, on the real embedded broker.

Faust's web server runs from before Faust's consumer starts (its producer has started then). The child holds as that
consumer starts (it writes ``starting`` in a file and holds until the test writes ``go``; the event loop runs on):
there ``/readyz`` answers 503 ``not ready: kafka: its consumer starting`` and ``/metrics`` 200, and once the consumer
has started, ``/readyz`` answers 200 with the worker's status, as before. Before, ``/readyz`` answered 200 as soon as
the web server ran, a moment before the consumer did (for as long as its start took: a broker that takes connections
and answers nothing holds it for its request timeout).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_children import child_env, popen, topics_on, wait_for
from child_processes import Gathered, http_get

from app.kafka.embedded import EmbeddedBroker

pytestmark = pytest.mark.integration

# ``rttsched worker`` whose Faust consumer, as it starts (before its client does), writes ``starting`` and holds
# until ``go`` exists, its event loop running on (the web server answers meanwhile)
CHILD = """
import asyncio, os, sys
from pathlib import Path

import faust.transport.drivers.aiokafka as driver

marks = Path(os.environ["MARKS"])
on_start = driver.Consumer.on_start

async def held(self):
    (marks / "starting").write_text("")
    while not (marks / "go").exists():
        await asyncio.sleep(0.02)
    await on_start(self)

driver.Consumer.on_start = held

from app.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def worker(broker: EmbeddedBroker, tmp_path: Path) -> Iterator[tuple[Gathered, int]]:
    env = child_env(topics_on(broker), tmp_path, RTT_WORKER_DATADIR=str(tmp_path / "faust"), PYTHONUNBUFFERED="1")
    proc = Gathered(popen(CHILD, ("worker",), env))
    try:
        yield proc, int(env["RTT_METRICS_PORT"])
    finally:
        proc.kill()


def test_readyz_answers_200_only_once_the_workers_consumer_has_started(
        worker: tuple[Gathered, int], tmp_path: Path) -> None:
    proc, port = worker
    wait_for(proc, (tmp_path / "starting").exists, "the consumer's start")
    wait_for(proc, lambda: http_get(port, "/metrics")[0] == 200, "Faust's web server")  # it runs: the wait is over
    assert http_get(port, "/readyz") == (503, b"not ready: kafka: its consumer starting\n"), proc.text[-6000:]
    (tmp_path / "go").write_text("")
    wait_for(proc, lambda: http_get(port, "/readyz") == (200, b'{"ready":true,"degraded":{}}'),
             "/readyz 200 once the consumer started")
    os.killpg(proc.proc.pid, signal.SIGTERM)
    assert proc.proc.wait(60) == 0, proc.text[-6000:]
    proc.read_to_end()
    assert "Traceback" not in proc.text, proc.text[-6000:]
