"""``rttsched worker`` and ``rttsched trainer`` stopped while the broker's name is being looked up, by a resolver that
does not answer (the lookup runs in a thread of the event loop's executor, which nothing cancels).

The first SIGTERM stops the start wait; its event loop's end then waits for that thread. A second SIGTERM or Ctrl-C
meanwhile ends the process at once: one line, exit code 128 + the signal's number. It used to be kept as a signal
after the stop, which changes nothing: the process went on waiting for the lookup, and neither SIGTERM nor Ctrl-C
(nor ``timeout``'s SIGTERM) ended it.

The child's ``socket.getaddrinfo`` holds for the broker's host until the test lets it go; the test sends the second
signal once the event loop's executor is being shut down (``shutting`` written), the moment the stop waits there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from child_processes import Gathered

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
START_S = 60.0  # imports on a loaded machine
HOST = "kafka.lookup-held.invalid"

CHILD = """
import asyncio, os, socket, sys, time
from pathlib import Path

marks = Path(os.environ["MARKS"])
lookup = socket.getaddrinfo

def getaddrinfo(host, *args, **kwargs):
    if host == os.environ["HELD_HOST"]:  # a resolver that does not answer, until the test lets it go
        (marks / "resolving").write_text("")
        while not (marks / "go").exists():
            time.sleep(0.01)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    return lookup(host, *args, **kwargs)

socket.getaddrinfo = getaddrinfo
shutdown = asyncio.BaseEventLoop.shutdown_default_executor

async def shutting(self, *args, **kwargs):
    (marks / "shutting").write_text("")
    return await shutdown(self, *args, **kwargs)

asyncio.BaseEventLoop.shutdown_default_executor = shutting

from app.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[[str], Gathered]]:
    started: list[Gathered] = []

    def run(command: str) -> Gathered:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RTT_") and k != "REDIS_URL"}
        env.update(RTT_KAFKA_BOOTSTRAP=f"{HOST}:9092", HELD_HOST=HOST, RTT_MODELS_DIR=str(tmp_path / "models"),
                   RTT_WORKER_DATADIR=str(tmp_path / "data"), RTT_METRICS_PORT="0", RTT_TRAINER_CPUS="",
                   MARKS=str(tmp_path), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        proc = Gathered(subprocess.Popen([sys.executable, "-c", CHILD, command], env=env, cwd=REPO, text=True,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True))
        started.append(proc)
        return proc

    yield run
    (tmp_path / "go").write_text("")  # the held lookup ends
    for proc in started:
        proc.kill()


def wait_for(proc: Gathered, mark: Path) -> None:
    deadline = time.monotonic() + START_S
    while not mark.exists():
        assert proc.proc.poll() is None, f"ended (exit {proc.proc.returncode}) before {mark.name}:\n{proc.text}"
        assert time.monotonic() < deadline, f"no {mark.name} within {START_S:g} s:\n{proc.text}"
        time.sleep(0.02)


@pytest.mark.parametrize(("command", "second"), [("worker", signal.SIGTERM), ("worker", signal.SIGINT),
                                                 ("trainer", signal.SIGTERM)],
                         ids=["worker-SIGTERM", "worker-SIGINT", "trainer-SIGTERM"])
def test_a_second_signal_while_the_stop_waits_for_a_name_lookup_ends_the_process_at_once(
        start: Callable[[str], Gathered], tmp_path: Path, command: str, second: signal.Signals) -> None:
    proc = start(command)
    wait_for(proc, tmp_path / "resolving")
    os.killpg(proc.proc.pid, signal.SIGTERM)  # the first: stops the wait
    wait_for(proc, tmp_path / "shutting")  # the stop waits for the lookup's thread
    os.killpg(proc.proc.pid, second)
    try:
        code: int | None = proc.proc.wait(10)
    except subprocess.TimeoutExpired:
        code = None
    assert code is not None, f"{command} still running 10 s after a second signal, waiting for the lookup:\n{proc.text}"
    proc.read_to_end()
    assert code == 128 + second.value, proc.text
    assert f"{command}: {second.name} during the stop (SIGTERM): exiting at once without finishing it\n" in proc.text, \
        proc.text
    assert "Traceback" not in proc.text, proc.text
