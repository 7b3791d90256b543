"""The fault stack's start (bench/fault_stack.py), without a broker: a start that fails stops what it started.

Its processes run in sessions of their own, so nothing else stops them: before, an extender that never became
ready left the broker, worker and trainer running, reparented to pid 1.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import fault_stack
import pytest
from fault_stack import Stack

from app.cli.processes import ProcessError, ProcessGroup


class Broker:
    bootstrap = "127.0.0.1:1"

    def __init__(self) -> None:
        self.running = False

    def start(self) -> Broker:
        self.running = True
        return self

    def stop(self) -> None:
        self.running = False


class SleepingGroup(ProcessGroup):
    """A real process group whose children sleep instead of serving; the extender never becomes ready."""

    started: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, args: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
        self.children[name] = proc
        self.started.append(proc)
        return proc

    def wait_http(self, name: str, url: str, timeout_s: float = 60.0) -> None:
        if name == "extender":
            raise ProcessError(f"{name} was not ready at {url} within 0s")


def test_a_stack_whose_last_process_fails_to_start_stops_the_others(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    brokers: list[Broker] = []
    monkeypatch.setattr(fault_stack, "EmbeddedBroker", lambda: brokers.append(Broker()) or brokers[-1])
    monkeypatch.setattr(fault_stack, "ProcessGroup", SleepingGroup)
    monkeypatch.setattr(SleepingGroup, "started", [])
    monkeypatch.setattr(Stack, "create_topics", lambda self: None)
    stack = Stack(tmp_path)
    try:
        with pytest.raises(ProcessError, match="extender was not ready"):
            stack.start()
        children = SleepingGroup.started
        assert len(children) == 3  # worker, trainer, extender: each started before the extender failed
        assert [p.poll() for p in children] == [-signal.SIGTERM] * 3  # stopped, not left running
        assert [b.running for b in brokers] == [False]
    finally:
        for proc in SleepingGroup.started:  # only if the assertion above failed
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)


def test_a_count_that_falls_short_shows_the_workers_warnings(tmp_path: Path) -> None:
    group = ProcessGroup(tmp_path)
    (tmp_path / "worker.log").write_text("INFO reading\nWARNING joined late\n")
    (tmp_path / "worker-2.log").write_text("ERROR restore failed\n" + "".join(f"WARNING w{i}\n" for i in range(45)))
    (tmp_path / "extender.log").write_text("WARNING not a worker's\n")
    stack = Stack.__new__(Stack)
    stack.group = group
    said = fault_stack.worker_warnings(stack)
    lines = said.splitlines()
    assert lines[0] == "; workers' warnings:" and len(lines) == 41  # the last 40
    assert lines[1:3] == ["worker-2: WARNING w6", "worker-2: WARNING w7"]
    assert lines[-1] == "worker: WARNING joined late" and "extender" not in said and "INFO" not in said
    (tmp_path / "worker.log").write_text("INFO all well\n")
    (tmp_path / "worker-2.log").unlink()
    assert fault_stack.worker_warnings(stack) == ""
