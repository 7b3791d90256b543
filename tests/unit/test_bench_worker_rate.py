"""bench/bench_worker.py reads the worker's rate from ``rtt_worker_messages_in_total``, which moves once per
checkpoint: a drain within one step used to divide 0 by 0 (``--quick``), and one of a few steps gave a rate of
the steps' timing. The worker run checkpoints every 0.1 s; a drain within one step is reported, not measured."""

from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    module = importlib.import_module("bench_worker")
    yield module
    sys.modules.pop("bench_worker", None)


def counter(monkeypatch: pytest.MonkeyPatch, bench: Any, steps: list[tuple[float, float]]) -> None:
    """The worker's counter and the clock: ``(perf_counter, value)`` per poll."""
    polls = iter(steps)
    now = [0.0]

    def messages_in(url: str) -> float:
        now[0], value = next(polls)
        return value

    monkeypatch.setattr(bench, "messages_in", messages_in)
    monkeypatch.setattr(bench.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(bench.time, "sleep", lambda s: None)


def test_a_drain_counted_in_one_step_is_not_measured(monkeypatch: pytest.MonkeyPatch, bench: Any) -> None:
    counter(monkeypatch, bench, [(0.0, 0.0), (0.05, 0.0), (0.1, 10_000.0)])
    assert math.isnan(bench.worker_rate("x", 10_000, 5.0))  # before: ZeroDivisionError


def test_the_rate_is_taken_between_the_first_and_the_last_step(monkeypatch: pytest.MonkeyPatch, bench: Any) -> None:
    counter(monkeypatch, bench, [(0.0, 0.0), (1.0, 3_000.0), (1.05, 3_000.0), (1.1, 6_000.0), (1.2, 9_000.0),
                                 (1.3, 10_000.0)])
    assert bench.worker_rate("x", 10_000, 5.0) == pytest.approx(7_000 / 0.3)


def test_the_worker_run_checkpoints_often() -> None:
    """The counter moves once per checkpoint: the worker run sets the interval (0.1 s unless told)."""
    source = (ROOT / "bench" / "bench_worker.py").read_text(encoding="utf-8")
    assert '"RTT_WORKER_CHECKPOINT_INTERVAL_S": str(args.checkpoint_interval)' in source
