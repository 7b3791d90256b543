"""``RTT_KAFKA_START_WAIT_S`` bounds the worker's whole start, on the real embedded broker: its waits and tries from
the worker's start, not each wait anew.

The broker answers the worker's first wait and is gone before Faust's producer connected (the child of
:mod:`test_worker_broker_gone_at_start` holds between the two, here for a few seconds, until the test has stopped the
broker): the worker goes back to waiting, for what is left of the bound only. Before, the second wait counted the bound
from zero again, and the worker ended the bound's seconds after Faust's failed start (the hold's seconds more than the
bound in all). With no bound left as Faust's start fails, it ends at once with one line, exit code 2.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_children import child_env, topics_on
from test_worker_broker_gone_at_start import START_S, Worker, assert_no_traceback

from app.kafka.embedded import EmbeddedBroker

pytestmark = pytest.mark.integration


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:  # stopped whatever the test did
        yield b


@pytest.fixture
def bounded_worker(tmp_path: Path, broker: EmbeddedBroker, request: pytest.FixtureRequest) -> Iterator[Worker]:
    """The holding worker (HOLD=wait) with ``RTT_KAFKA_START_WAIT_S`` = the test's parameter."""
    worker = Worker(child_env(topics_on(broker), tmp_path, RTT_WORKER_DATADIR=str(tmp_path / "faust"),
                              RTT_KAFKA_START_WAIT_S=f"{request.param:g}", HOLD="wait"))
    try:
        yield worker
    finally:
        worker.kill()


def gone_after(worker: Worker, broker: EmbeddedBroker, marks: Path, hold_s: float) -> float:
    """Once the worker holds after its first wait, ``hold_s`` later, stop the broker and let the worker on; the
    monotonic time the hold began."""
    worker.wait_for((marks / "answered").exists, "the hold after the wait")
    answered = time.monotonic()
    time.sleep(hold_s)
    broker.stop()
    (marks / "gone").write_text("")
    return answered


def ended_with_code_2(worker: Worker, since: float, after: str) -> tuple[float, str, list[str]]:
    """The worker's end, with exit code 2, printed with the seconds since ``since`` (``after`` says what that was):
    those seconds, its output and its error lines."""
    code = worker.ended(START_S)
    took = time.monotonic() - since
    text = worker.text
    print(f"exit code {code} {took:.1f} s after {after}")
    assert code == 2, text[-6000:]
    return took, text, [line for line in text.splitlines() if line.startswith("rttsched worker: error: ")]


@pytest.mark.parametrize("bounded_worker", [10.0], indirect=True)
def test_a_worker_sent_back_to_waiting_waits_only_for_what_is_left_of_the_bound(
        bounded_worker: Worker, broker: EmbeddedBroker, tmp_path: Path) -> None:
    bound_s, hold_s = 10.0, 6.0
    answered = gone_after(bounded_worker, broker, tmp_path, hold_s)
    bounded_worker.line(r"as Faust started: .*; waiting for it again")
    # the second wait says what is left of the bound, not the whole bound again
    bounded_worker.line(r"(?m)worker: waiting for Kafka: .* for the [0-4] s left of RTT_KAFKA_START_WAIT_S=10$")
    took, text, errors = ended_with_code_2(bounded_worker, answered,
                                           f"the first wait passed (bound {bound_s:g} s, hold {hold_s:g} s)")
    assert len(errors) == 1 and errors[0].startswith(
        f"rttsched worker: error: cannot reach Kafka at {broker.bootstrap} (RTT_KAFKA_BOOTSTRAP)"), text[-6000:]
    said = re.search(r"\(gave up after (\d+) s: RTT_KAFKA_START_WAIT_S=10\)$", errors[0])
    assert said is not None and bound_s <= int(said.group(1)) <= bound_s + 2, errors
    # the first wait passed after the worker's start: what is left of the bound then is less than the bound (a last
    # try gets 1 s); it used to wait the whole bound again after Faust's start failed, the hold's 6 s later
    assert took < bound_s + 2.5, f"{took:.1f} s after the first wait:\n{text[-6000:]}"
    assert_no_traceback(text)


@pytest.mark.parametrize("bounded_worker", [5.0], indirect=True)
def test_a_worker_whose_bound_has_passed_as_fausts_start_fails_ends_at_once(
        bounded_worker: Worker, broker: EmbeddedBroker, tmp_path: Path) -> None:
    gone_after(bounded_worker, broker, tmp_path, 7.0)
    gone = time.monotonic()
    took, text, errors = ended_with_code_2(bounded_worker, gone,
                                           "the broker was gone (bound 5 s, passed during the 7 s hold)")
    assert len(errors) == 1 and re.fullmatch(
        rf"rttsched worker: error: cannot reach Kafka at {re.escape(broker.bootstrap)} \(RTT_KAFKA_BOOTSTRAP\) as"
        r" Faust started: .* \(gave up after \d+ s: RTT_KAFKA_START_WAIT_S=5\)", errors[0]), text[-6000:]
    assert "waiting for it again" not in text, text[-6000:]
    assert took < 5.0, f"{took:.1f} s after the broker was gone:\n{text[-6000:]}"
    assert_no_traceback(text)
