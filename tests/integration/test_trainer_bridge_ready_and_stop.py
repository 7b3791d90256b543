"""``rttsched trainer`` and ``rttsched bridge`` at the ends of their lives, on the real embedded broker.

They answer ``/readyz`` 200 only once their Kafka clients have started: the trainer's consumers and producer, the
bridge's producer. The child holds as those clients start, after the start wait passed (it writes ``starting`` in a
file and holds until the test writes ``go``): there ``/readyz`` answers 503 ``not ready: kafka: its clients starting``
(the bridge's: ``its producer starting``), and 200 once they have started. Before, ``/readyz`` answered 200 as soon as
the wait passed, a moment before the clients ran (for as long as their start took: a broker that takes connections
and answers nothing holds it 40 s per client).

A signal once the trainer's clean stop has finished, while its event loop closes, changes nothing: exit code 0. The
child holds there (``stopped`` written, until ``go``). Before, it was taken for a second signal during the stop: one
line, exit code 143.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from broker_children import child_env, popen, topics_on, wait_for
from child_processes import Gathered, http_get

from app.kafka.embedded import EmbeddedBroker

pytestmark = pytest.mark.integration

# ``rttsched <argv>`` that holds (a sleep: its event loop held too; the probes answer from a thread of their own),
# by HOLD: ``start``: as its clients start, until ``go`` (``starting`` written): the trainer's service start, the
# bridge's producer start; ``closing``: once the trainer's stop has finished, as asyncio.run closes its event loop,
# until ``go`` (``stopped`` written)
CHILD = """
import asyncio, os, sys, time
from pathlib import Path

import app.bridge.scraper as scraper
from app.trainer.service import TrainerService

marks = Path(os.environ["MARKS"])

def held(mark, call):
    async def holding(*args, **kwargs):
        (marks / mark).write_text("")
        while not (marks / "go").exists():
            time.sleep(0.01)
        return await call(*args, **kwargs)
    return holding

if os.environ["HOLD"] == "start":
    TrainerService.start = held("starting", TrainerService.start)
    scraper.start_producer = held("starting", scraper.start_producer)
else:
    stop, stopped = TrainerService.stop, []

    async def stopping(self):
        await stop(self)
        stopped.append(self)

    TrainerService.stop = stopping
    shutdown_asyncgens = asyncio.BaseEventLoop.shutdown_asyncgens

    async def closing(self):
        if stopped:  # the stop has finished: asyncio.run ends, its event loop closed after this
            (marks / "stopped").write_text("")
            while not (marks / "go").exists():
                await asyncio.sleep(0.01)  # the loop runs: a signal's handler too
        await shutdown_asyncgens(self)

    asyncio.BaseEventLoop.shutdown_asyncgens = closing

from app.cli.main import main
sys.exit(main(sys.argv[1:]))
"""

READY = {"trainer": (b"ok\n", b"not ready: kafka: its clients starting\n"),
         "bridge": (b"ok\n", b"not ready: kafka: its producer starting\n")}
ARGV = {"trainer": ["trainer"], "bridge": ["bridge", "--target", "node=w1,url=http://127.0.0.1:9/m"]}


@pytest.fixture
def service(broker: EmbeddedBroker, tmp_path: Path) -> Iterator[Callable[..., tuple[Gathered, int]]]:
    started: list[Gathered] = []

    def start(command: str, hold: str = "start") -> tuple[Gathered, int]:
        env = child_env(topics_on(broker), tmp_path, RTT_TRAINER_CPUS="", RTT_REGISTRY_CHECK_S="0", HOLD=hold,
                        PYTHONUNBUFFERED="1")
        proc = Gathered(popen(CHILD, ARGV[command], env))
        started.append(proc)
        return proc, int(env["RTT_METRICS_PORT"])

    yield start
    for proc in started:
        proc.kill()


@pytest.mark.parametrize("command", ["trainer", "bridge"])
def test_readyz_answers_200_only_once_the_kafka_clients_have_started(
        service: Callable[..., tuple[Gathered, int]], tmp_path: Path, command: str) -> None:
    proc, metrics = service(command)
    wait_for(proc, (tmp_path / "starting").exists, "the clients' start")
    ready, starting = READY[command]
    assert http_get(metrics, "/readyz") == (503, starting), proc.text[-6000:]  # it was 200 here
    assert http_get(metrics, "/healthz")[0] == 200  # alive all the same: the heartbeat's last beat is recent
    (tmp_path / "go").write_text("")
    wait_for(proc, lambda: http_get(metrics, "/readyz") == (200, ready), "/readyz 200 once the clients started")
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.proc.wait(60) == 0, proc.text[-6000:]
    proc.read_to_end()
    assert "Traceback" not in proc.text and "error:" not in proc.text, proc.text[-6000:]


def test_a_signal_once_the_trainers_stop_has_finished_keeps_exit_code_0(
        service: Callable[..., tuple[Gathered, int]], tmp_path: Path) -> None:
    proc, metrics = service("trainer", "closing")
    wait_for(proc, lambda: http_get(metrics, "/readyz")[0] == 200, "/readyz 200")
    proc.proc.send_signal(signal.SIGTERM)  # the clean stop
    wait_for(proc, (tmp_path / "stopped").exists, "the end of the stop")
    for second in (signal.SIGINT, signal.SIGTERM):  # both, one trainer: either one acted on ends it with 130 or 143
        proc.proc.send_signal(second)
    (tmp_path / "go").write_text("")
    code = proc.proc.wait(60)
    proc.read_to_end()
    print(proc.text)
    assert code == 0, proc.text[-6000:]
    assert "during the stop" not in proc.text and "Traceback" not in proc.text, proc.text[-6000:]
