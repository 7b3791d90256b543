"""``rttsched worker`` signalled at the moments of its start between two event loops, and during the stop of a failed
start, on the real embedded broker. The child pauses at the exact moment (a function of the start wrapped: it writes
``gap`` or ``stopping`` in a file and holds until the test writes ``go``); the test sends the signal there.

- Between the end of its Kafka start wait and Faust's signal handlers (making the Faust app: ~150 ms), and between a
  failed start and the wait that follows it (~2 ms), SIGTERM and Ctrl-C used to find the signals at their default:
  SIGTERM ended the worker at once with 143, Ctrl-C with Python's ``KeyboardInterrupt`` (``interrupted``, 130). Now
  they stop it cleanly, exit code 0, as at any other moment of the start.
- A SIGTERM during the stop of a start that failed on a Kafka error used to end the worker with code 0 and nothing
  said of the failure. Now the failure's one line is said and the exit code is 2: the signal only asked for the stop
  that was under way.
- A SIGTERM once a clean stop has finished, while Faust gathers its tasks and closes its event loop, used to end the
  worker with 143; now it stays 0.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from broker_children import popen
from child_processes import Gathered
from test_worker_broker_gone_at_start import (
    START_S,
    Worker,
    assert_no_traceback,
    errors,
    refused,
    start_worker,
    stop_broker_when_answered,
)

from app.config import Settings
from app.kafka.embedded import EmbeddedBroker

pytestmark = pytest.mark.integration
__all__ = ["start_worker"]  # a fixture of test_worker_broker_gone_at_start, used here

# ``rttsched worker`` that holds, by HOLD (a comma-separated list of):
# - ``app``: as its first Faust app is made (its start wait passed), until ``go`` (``gap`` written);
# - ``answered``: after its first start wait, until ``gone`` (``answered`` written: the test stops the broker
#   meanwhile, Faust's start fails on it);
# - ``again``: as it makes its series for the wait that follows a failed start, until ``go`` (``gap`` written);
# - ``refused``: Faust's producer fails to start with a Kafka error that is not the broker gone;
# - ``stopping``: the app's stop holds until ``go`` (``stopping`` written);
# - ``gathering``: once the worker's stop has finished, as Faust gathers its tasks before it closes its event loop,
#   until ``go`` (``stopped`` written); ``closed``: once Faust has closed its event loop, until ``go-closed``
#   (``closed`` written); ``closing``: once Faust's stop has run its event loop for the last time, before it closes
#   it, until ``go`` (``closing`` written).
CHILD = """
import asyncio, os, sys, time
from pathlib import Path

import faust
import faust.transport.drivers.aiokafka as driver
from aiokafka.errors import UnsupportedVersionError

import app.kafka.admin as admin
import app.streams.app as streams_app
import app.streams.metrics as streams_metrics
import app.streams.shutdown as shutdown

marks = Path(os.environ["MARKS"])
holds = os.environ["HOLD"].split(",")

def held(mark, go="go"):
    (marks / mark).write_text("")
    while not (marks / go).exists():
        time.sleep(0.01)

if "app" in holds:
    create_app = streams_app.create_app

    def creating(*args, **kwargs):
        held("gap")
        return create_app(*args, **kwargs)

    streams_app.create_app = creating
if "answered" in holds:
    real, waits = admin.wait_reachable, []

    async def wait_reachable(*args, **kwargs):
        waited = await real(*args, **kwargs)
        waits.append(waited)
        if len(waits) == 1:
            (marks / "answered").write_text("")
            while not (marks / "gone").exists():
                await asyncio.sleep(0.05)
        return waited

    admin.wait_reachable = wait_reachable
if "again" in holds:
    made = []

    class Metrics(streams_metrics.WorkerMetrics):
        def __init__(self):
            made.append(self)
            if len(made) == 2:
                held("gap")
            super().__init__()

    streams_metrics.WorkerMetrics = Metrics
if "refused" in holds:
    async def refused(self):
        raise UnsupportedVersionError("the broker does not support the producer's requests")

    driver.Producer.on_start = refused
if "stopping" in holds:
    on_stop = faust.App.on_stop

    async def stopping(self):
        (marks / "stopping").write_text("")
        while not (marks / "go").exists():
            await asyncio.sleep(0.01)
        await on_stop(self)

    faust.App.on_stop = stopping
if "gathering" in holds:
    gather = shutdown.DeadlineWorker._gather_all

    def gathering(self):
        held("stopped")
        gather(self)

    shutdown.DeadlineWorker._gather_all = gathering
if "closing" in holds:
    shutdown_loop = shutdown.DeadlineWorker._shutdown_loop

    def last_step(self):
        close = self.loop.close

        def closing():
            held("closing")
            close()

        self.loop.close = closing
        shutdown_loop(self)

    shutdown.DeadlineWorker._shutdown_loop = last_step
if "closed" in holds:
    stop_and_shutdown = shutdown.DeadlineWorker.stop_and_shutdown

    def closed(self):
        stop_and_shutdown(self)
        held("closed", "go-closed")

    shutdown.DeadlineWorker.stop_and_shutdown = closed

from app.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


class HeldWorker(Worker):
    """The child above, ``rttsched worker``."""

    def __init__(self, env: dict[str, str], args: tuple[str, ...] = ()) -> None:
        Gathered.__init__(self, popen(CHILD, (*args, "worker"), env))


@pytest.fixture
def held_worker(start_worker: Callable[..., tuple[Worker, Settings, int]],
                monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], tuple[HeldWorker, int]]]:
    """``start_worker``'s worker (broker, topics, environment), as the child above; with its metrics port."""
    import test_worker_broker_gone_at_start as gone

    monkeypatch.setattr(gone, "Worker", HeldWorker)  # what start_worker starts

    def start(hold: str) -> tuple[HeldWorker, int]:
        worker, _, metrics = start_worker(hold)
        assert isinstance(worker, HeldWorker)
        return worker, metrics

    yield start


def signalled_at(worker: Worker, mark: Path, signum: int = signal.SIGTERM, go: str = "go") -> tuple[int, float]:
    """Once the worker holds (``mark``), send ``signum`` and let it on (``go``): its exit code and the seconds it
    took."""
    worker.wait_for(mark.exists, mark.name)
    asked = time.monotonic()
    os.killpg(worker.proc.pid, signum)
    (mark.parent / go).write_text("")
    code = worker.ended(START_S)
    took = time.monotonic() - asked
    print(f"exit code {code} {took:.2f} s after {signal.Signals(signum).name} at {mark.name!r}")
    return code, took


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_between_the_start_wait_and_fausts_handlers_stops_the_worker_cleanly(
        held_worker: Callable[[str], tuple[HeldWorker, int]], tmp_path: Path, signum: int) -> None:
    worker, _ = held_worker("app")
    code, _ = signalled_at(worker, tmp_path / "gap", signum)
    text = worker.text
    assert code == 0, text[-6000:]
    assert f"worker: stopped ({signal.Signals(signum).name}) as it started\n" in text, text[-6000:]
    assert "interrupted" not in text and "error:" not in text, text[-6000:]
    assert_no_traceback(text)


@pytest.mark.parametrize(("hold", "mark"), [("answered,again", "gap"), ("answered,closing", "closing")],
                         ids=["before-the-wait", "after-the-last-run-of-the-failed-starts-event-loop"])
def test_sigterm_between_a_failed_start_and_the_wait_that_follows_stops_the_worker_cleanly(
        held_worker: Callable[[str], tuple[HeldWorker, int]], broker: EmbeddedBroker, tmp_path: Path, hold: str,
        mark: str) -> None:
    """``again``: held as the wait that follows is made. ``closing``: Faust's stop runs its event loop step by step,
    then closes it: a signal between the two was queued on a loop that never ran again, and the worker waited for the
    broker again as if none had come."""
    worker, _ = held_worker(hold)
    stop_broker_when_answered(worker, broker, tmp_path)
    code, _ = signalled_at(worker, tmp_path / mark)
    text = worker.text
    assert "waiting for it again" in text, text[-6000:]
    assert code == 0, text[-6000:]
    assert "worker: stopped (SIGTERM) while waiting for Kafka\n" in text, text[-6000:]
    assert_no_traceback(text)


def test_sigterm_during_the_stop_of_a_failed_start_still_says_the_failure_and_exits_2(
        held_worker: Callable[[str], tuple[HeldWorker, int]], broker: EmbeddedBroker, tmp_path: Path) -> None:
    worker, _ = held_worker("refused,stopping")
    code, took = signalled_at(worker, tmp_path / "stopping")
    text = worker.text
    assert code == 2, text[-6000:]
    assert errors(text) == [refused(broker.bootstrap)], text[-6000:]
    assert took < 10.0, text[-6000:]  # the stop under way, no more
    assert_no_traceback(text)


def test_sigterm_during_the_stop_of_a_start_failed_on_a_broker_gone_says_it_and_does_not_wait_again(
        held_worker: Callable[[str], tuple[HeldWorker, int]], broker: EmbeddedBroker, tmp_path: Path) -> None:
    worker, _ = held_worker("answered,stopping")
    stop_broker_when_answered(worker, broker, tmp_path)
    code, took = signalled_at(worker, tmp_path / "stopping")
    text = worker.text
    assert code == 2, text[-6000:]
    said = errors(text)
    assert len(said) == 1 and said[0].startswith(
        f"rttsched worker: error: cannot reach Kafka at {broker.bootstrap} (RTT_KAFKA_BOOTSTRAP) as Faust started: "
    ) and "gave up after" not in said[0], text[-6000:]
    assert "waiting for it again" not in text and "waiting for Kafka" not in text, text[-6000:]
    assert took < 10.0, text[-6000:]
    assert_no_traceback(text)


def test_sigterm_after_a_clean_stop_keeps_exit_code_0(
        held_worker: Callable[[str], tuple[HeldWorker, int]], tmp_path: Path) -> None:
    worker, _ = held_worker("gathering,closed")  # one worker, a signal at each moment: a worker's start is the cost
    worker.line(r"INFO faust\.worker: \[\^DeadlineWorker\]: Ready\n")  # started: its clients and its recovery
    os.killpg(worker.proc.pid, signal.SIGTERM)  # the first: a clean stop
    stopped = tmp_path / "stopped"
    worker.wait_for(stopped.exists, stopped.name)  # that stop has finished: Faust gathers its tasks
    os.killpg(worker.proc.pid, signal.SIGTERM)
    (tmp_path / "go").write_text("")
    code, _ = signalled_at(worker, tmp_path / "closed", go="go-closed")  # and once Faust has closed its event loop
    text = worker.text
    assert code == 0, text[-6000:]
    assert_no_traceback(text)
