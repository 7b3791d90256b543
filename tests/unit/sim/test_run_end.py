"""A run ends when its last task is done (at the scrape that sees it), not at a node event scripted past it:
an event in seconds beyond the last task stretched makespan_s and diluted gpu_util and load_diff."""

from __future__ import annotations

import numpy as np
import pytest

from app.sim.events import EventSpec
from app.sim.runner import SimConfig, run_offline

LOAD = {"gpu": 0.8, "cpu": 4.0}


def _run(*events: EventSpec, policy: str = "kube_default"):
    return run_offline(SimConfig(n_tasks=300, rate_per_s=20.0, events=tuple(events)), policy, 1)


def _same(a, b) -> None:
    sa, sb = a.summary(), b.summary()
    sa.pop("tasks_per_wall_s"), sb.pop("tasks_per_wall_s")
    assert sa == pytest.approx(sb, nan_ok=True, rel=0, abs=0)
    assert a.fingerprint() == b.fingerprint()


def test_an_event_after_the_last_task_changes_nothing():
    plain = _run()
    late = _run(EventSpec("slowdown", "cpu-1", at=5000.0, factor=3.0))
    assert plain.makespan_s < 60.0
    _same(late, plain)


def test_an_event_lasting_past_the_last_task_ends_with_the_run():
    """A neighbour from 1 s on: its end past the run (until 4000 or 5000 s) changes no figure, as in pulsing,
    whose last neighbour lasts to 360 s though its last task finishes at 341.7 s."""
    to_4000 = _run(EventSpec("neighbour", "worker-2", at=1.0, until=4000.0, loads=LOAD))
    to_5000 = _run(EventSpec("neighbour", "worker-2", at=1.0, until=5000.0, loads=LOAD))
    assert to_5000.makespan_s < 60.0 and to_5000.summary()["gpu_util"] > 0.05
    _same(to_5000, to_4000)


def test_the_span_ends_at_the_scrape_after_the_last_finish():
    m = _run(EventSpec("slowdown", "cpu-1", at=5000.0, factor=3.0))
    last = float(np.nanmax(m.finish_s))
    assert last <= m.makespan_s < last + 1.0  # the scrape interval: 1 s
