"""The worker's stop deadline: one ERROR line and exit code 1 when the stop outlasts it, nothing when it does not."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import faust
import pytest

from app.kafka.embedded import free_port
from app.streams.shutdown import EXIT_CODE, DeadlineWorker, StopDeadline, log_thread_end

MODE_LOGGER = logging.getLogger("faust.transport.drivers.aiokafka")


class Exits:
    """Stands in for ``os._exit``: records the code instead of ending the test run."""

    def __init__(self) -> None:
        self.codes: list[int] = []
        self.called = threading.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.called.set()


@pytest.fixture
def exits() -> Exits:
    return Exits()


@pytest.fixture
def deadlines() -> Iterator[list[StopDeadline]]:
    """Every deadline a test makes is disarmed after it: the root logger's handler and threading's hook go back."""
    made: list[StopDeadline] = []
    yield made
    for d in made:
        d.disarm()


def no_broker() -> str:
    return f"127.0.0.1:{free_port()}"


def test_the_deadline_logs_what_the_stop_waited_for_and_exits_1(caplog: pytest.LogCaptureFixture, exits: Exits,
                                                                 deadlines: list[StopDeadline]) -> None:
    caplog.set_level(logging.INFO)
    bootstrap = no_broker()
    deadline = StopDeadline(0.3, bootstrap, exit=exits)
    deadlines.append(deadline)
    deadline.arm("SIGTERM")
    MODE_LOGGER.info("[^---AIOKafkaConsumerThread]: Stopping...")
    assert exits.called.wait(5)
    assert exits.codes == [EXIT_CODE] == [1]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is None
    line = errors[0].getMessage()
    assert line.startswith("worker did not finish stopping within 0.3 s of SIGTERM (still stopping"
                           f" AIOKafkaConsumerThread; the broker at {bootstrap} does not answer); exiting with code 1")
    assert "\n" not in line


def test_a_broker_that_takes_connections_is_said_so(caplog: pytest.LogCaptureFixture, exits: Exits,
                                           deadlines: list[StopDeadline]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        bootstrap = f"127.0.0.1:{server.getsockname()[1]}"
        deadline = StopDeadline(0.1, bootstrap, exit=exits)
        deadlines.append(deadline)
        deadline.arm("SIGINT")
        assert exits.called.wait(5)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and f"of SIGINT (the broker at {bootstrap} takes connections)" in errors[0]


def test_a_stop_that_ends_in_time_never_exits(caplog: pytest.LogCaptureFixture, exits: Exits,
                                              deadlines: list[StopDeadline]) -> None:
    deadline = StopDeadline(0.3, no_broker(), exit=exits)
    deadlines.append(deadline)
    deadline.arm("SIGTERM")
    deadline.disarm()
    assert not exits.called.wait(0.8)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_second_signal_keeps_the_first_deadline(exits: Exits, deadlines: list[StopDeadline]) -> None:
    deadline = StopDeadline(0.2, no_broker(), exit=exits)
    deadlines.append(deadline)
    deadline.arm("SIGTERM")
    first = deadline._thread
    assert first is not None
    deadline.arm("SIGINT")
    assert deadline._thread is first
    assert exits.called.wait(5)
    first.join(5)
    assert exits.codes == [1]


def test_a_thread_cancelled_by_the_stop_is_one_line(caplog: pytest.LogCaptureFixture,
                                                   deadlines: list[StopDeadline]) -> None:
    """Faust's consumer thread dies with CancelledError once the broker is gone: Python printed its traceback."""
    caplog.set_level(logging.INFO)
    deadline = StopDeadline(60, no_broker(), exit=Exits())
    deadlines.append(deadline)
    deadline.arm("SIGTERM")
    assert threading.excepthook is log_thread_end

    def cancelled() -> None:
        raise asyncio.CancelledError()

    def broken() -> None:
        raise RuntimeError("no leader")

    for target in (cancelled, broken):
        t = threading.Thread(target=target, name=target.__name__)
        t.start()
        t.join()
    said = [(r.levelname, r.getMessage(), r.exc_info) for r in caplog.records if r.name == "app.streams.shutdown"]
    assert ("INFO", "cancelled was cancelled by the stop", None) in said
    assert ("ERROR", "broken ended during the stop: RuntimeError: no leader", None) in said
    deadline.disarm()
    assert threading.excepthook is not log_thread_end


class Loop:
    """Records the signal handlers mode installs."""

    def __init__(self) -> None:
        self.handlers: dict[int, Any] = {}

    def add_signal_handler(self, sig: int, handler: Any) -> None:
        self.handlers[sig] = handler


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_worker_arms_the_deadline_before_faust_stops(sig: signal.Signals, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         deadlines: list[StopDeadline]) -> None:
    """mode installs ``self._on_sigterm`` / ``self._on_sigint``: the subclass's, which arm, then stop as Faust does."""
    app = faust.App("stop-deadline-test", broker="kafka://127.0.0.1:1", store="memory://", datadir=str(tmp_path),
                    web_enabled=False, autodiscover=False)
    deadline = StopDeadline(60, no_broker(), exit=Exits())
    deadlines.append(deadline)
    loop = Loop()
    worker = DeadlineWorker(app, deadline=deadline, quiet=True, redirect_stdouts=False, override_logging=False,
                            loop=loop)  # type: ignore[arg-type]
    scheduled: list[signal.Signals] = []
    monkeypatch.setattr(worker, "_schedule_shutdown", scheduled.append)
    worker.install_signal_handlers()
    assert not deadline.armed
    loop.handlers[sig]()
    assert deadline.armed and scheduled == [sig]
    assert deadline._thread is not None and deadline._thread.daemon
    assert worker._shutdown_immediately  # Faust's own handler ran too


@pytest.mark.parametrize(("value", "problem"), [("0", "must be > 0 (got 0.0)"), ("-1", "must be > 0 (got -1.0)"),
                                                ("inf", "must be finite (got inf)")])
def test_a_bad_stop_timeout_is_one_line_naming_the_flag(value: str, problem: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli.main import main

    assert main(["worker", "--stop-timeout-s", value]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"rttsched worker: error: --stop-timeout-s: {problem}"]
